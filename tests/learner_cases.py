"""Fixed learner inputs: each case builds a learner from a seeded policy and one batch made from a
seeded generator, so that tests can run the same update twice and compare (tests/test_learner.py
holds every case's update to a plain PyTorch loop; the algorithms' tests hold their losses to the
papers' formulas).
"""

from __future__ import annotations

from typing import Any, Callable

import gymnasium as gym
import numpy as np
import torch

from maze_cli.envs.spaces import action_spec, observation_specs
from maze_cli.learner import Learner
from maze_cli.records import Rollout, RolloutSpec, Transitions

CARTPOLE = (gym.spaces.Box(-5.0, 5.0, (4,)), gym.spaces.Discrete(2))
PENDULUM = (gym.spaces.Box(-8.0, 8.0, (3,)), gym.spaces.Box(-2.0, 2.0, (1,)))
T, B = 8, 6


def rollout(spaces: tuple[gym.Space, gym.Space], state_specs: tuple = ()) -> Rollout:
    """A time-major batch `[T, B]` with episodes that end (terminated and truncated) and autoreset steps."""
    obs_space, action_space = spaces
    g = torch.Generator().manual_seed(123)
    spec = RolloutSpec(observation_specs(obs_space), action_spec(action_space), n_steps=T, n_envs=B, state=state_specs)
    r = spec.allocate()
    r.observations["obs"].copy_(torch.randn(r.observations["obs"].shape, generator=g))
    r.final_observations["obs"].copy_(torch.randn(r.final_observations["obs"].shape, generator=g))
    if isinstance(action_space, gym.spaces.Discrete):
        r.actions.copy_(torch.randint(0, int(action_space.n), (T, B), generator=g))
    else:
        r.actions.copy_(torch.rand((T, B) + action_space.shape, generator=g) * 3.0 - 1.5)
    r.behaviour_logp.copy_(-torch.rand((T, B), generator=g) - 0.2)
    r.rewards.copy_(torch.randn((T, B), generator=g))
    ends = torch.rand((T, B), generator=g)
    r.terminated.copy_(ends < 0.1)
    r.truncated.copy_((ends >= 0.1) & (ends < 0.18))
    r.autoreset.zero_()
    r.autoreset[1:].copy_(r.terminated[:-1] | r.truncated[:-1])  # gymnasium's next-step autoreset
    r.episode_start.zero_()
    r.episode_start[0].fill_(True)
    r.episode_start[1:].copy_(r.autoreset)
    r.policy_version.zero_()
    r.env_id.copy_(torch.arange(B))
    for s in r.initial_state:
        s.copy_(torch.randn(s.shape, generator=g) * 0.1)
    return r


def transitions(spaces: tuple[gym.Space, gym.Space], n: int = 32):
    from maze_cli.parallel.workers_with_buffer import SampledBatch

    obs_space, action_space = spaces
    g = torch.Generator().manual_seed(321)
    obs = torch.randn((n,) + obs_space.shape, generator=g)
    nxt = torch.randn((n,) + obs_space.shape, generator=g)
    if isinstance(action_space, gym.spaces.Discrete):
        actions = torch.randint(0, int(action_space.n), (n,), generator=g)
    else:
        actions = torch.rand((n,) + action_space.shape, generator=g) * 3.8 - 1.9
    tr = Transitions({"obs": obs}, actions, torch.randn(n, generator=g), {"obs": nxt}, torch.rand(n, generator=g) < 0.15)
    return SampledBatch(tr, np.arange(n), torch.rand(n, generator=g) + 0.5, 1)


def _actor_critic_case(algorithm: str, spaces, core: str = "identity", shared: bool = False, options: dict | None = None, **hp: Any):
    from maze_cli.policies import ActorCritic, mlp_network

    normalize = isinstance(spaces[1], gym.spaces.Box)
    torch.manual_seed(7)
    network = {**mlp_network((16, 16), "tanh"), "core": core, "core_size": 8 if core != "identity" else None}
    policy = ActorCritic(*spaces, network, shared_network=shared, normalize_obs=normalize)
    if algorithm == "impala":
        from maze_cli.algorithms.impala import Impala, ImpalaObjective

        hp = {"normalize_advantage": False, **hp}  # the plain actor-critic loss of the paper
        learner = Learner(ImpalaObjective(policy, Impala(**hp), normalize), "cpu", **(options or {}))
    else:
        from maze_cli.algorithms.ppo import Appo, Ppo, PpoObjective

        config = Appo(**hp) if algorithm == "appo" else Ppo(**hp)
        objective = PpoObjective(policy, config, normalize)
        learner = Learner(objective, "cpu", max_env_steps=10_000, **(options or {}))
    state_specs = tuple(_state_spec(s) for s in policy.initial_state(1))
    return learner, rollout(spaces, state_specs), {"policy": learner.policy}


def _state_spec(tensor: torch.Tensor):
    from maze_cli.records import TensorSpec

    return TensorSpec(tuple(tensor.shape[1:]), tensor.dtype)


def _sac_case(spaces, options: dict | None = None):
    from maze_cli.algorithms.sac import Sac, SacObjective, SacPolicy
    from maze_cli.policies import mlp_network

    torch.manual_seed(11)
    network = mlp_network((16, 16), "relu")
    learner = Learner(SacObjective(SacPolicy(*spaces, network), Sac(), network), **(options or {}))
    return learner, transitions(spaces), {"policy": learner.policy, "critic": learner.objective.critic}


def _td3_case(options: dict | None = None):
    from maze_cli.algorithms.td3 import Td3, Td3Objective, Td3Policy
    from maze_cli.policies import mlp_network

    torch.manual_seed(13)
    network = mlp_network((16, 16), "relu")
    learner = Learner(Td3Objective(Td3Policy(*PENDULUM, network), Td3(policy_delay=2), network), **(options or {}))
    return learner, transitions(PENDULUM), {"policy": learner.policy, "critic": learner.objective.critic,
                                            "policy_target": learner.objective.policy_target}


def _dqn_case(options: dict | None = None):
    from maze_cli.algorithms.dqn import Dqn, DqnObjective, DqnPolicy
    from maze_cli.policies import mlp_network

    torch.manual_seed(17)
    hp = Dqn(dueling=True, target_update_interval=2, max_grad_norm=0.5)
    learner = Learner(DqnObjective(DqnPolicy(*CARTPOLE, mlp_network((16, 16), "relu"), dueling=True), hp), **(options or {}))
    return learner, transitions(CARTPOLE), {"policy": learner.policy, "target": learner.objective.target}


CASES: dict[str, Callable[..., tuple[Any, Any, dict[str, torch.nn.Module]]]] = {  # each takes the learner's options
    "impala_cartpole": lambda **o: _actor_critic_case("impala", CARTPOLE, options=o),
    "impala_pendulum": lambda **o: _actor_critic_case("impala", PENDULUM, options=o),
    "impala_lstm_shared": lambda **o: _actor_critic_case("impala", CARTPOLE, core="lstm", shared=True, options=o),
    "ppo_cartpole": lambda **o: _actor_critic_case("ppo", CARTPOLE, n_epochs=2, n_minibatches=3, clip_value=0.2, entropy_coef=0.01,
                                                   options=o),
    "ppo_pendulum_annealed": lambda **o: _actor_critic_case("ppo", PENDULUM, n_epochs=2, n_minibatches=2, anneal_lr=True,
                                                            anneal_clip=True, options=o),
    "ppo_gru": lambda **o: _actor_critic_case("ppo", CARTPOLE, core="gru", n_epochs=2, n_minibatches=2, options=o),
    "appo_cartpole": lambda **o: _actor_critic_case("appo", CARTPOLE, n_epochs=2, n_minibatches=2, options=o),
    "sac_pendulum": lambda **o: _sac_case(PENDULUM, o),
    "sac_discrete": lambda **o: _sac_case(CARTPOLE, o),
    "td3_pendulum": lambda **o: _td3_case(o),
    "dqn_dueling": lambda **o: _dqn_case(o),
}
