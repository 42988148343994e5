"""The run every off-policy algorithm (SAC, TD3, DQN) builds around its learner: workers that fill a
replay buffer, and the replay loop (maze_cli.loops) that samples from it at a fixed replay ratio."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Annotated, Any

from maze_cli.algorithms.base import Components, Run
from maze_cli.config.fields import Fraction, Gt, Le, NonNegativeInt, PositiveFloat, PositiveInt, key
from maze_cli.errors import ConfigError
from maze_cli.learner import Learner
from maze_cli.loops import ReplayLoop
from maze_cli.parallel.workers_with_buffer import BaseDistributedWorkersWithBuffer, initial_sampling_policy_or_random
from maze_cli.policies.base import Policy
from maze_cli.policies.blueprint import initial_sampling_policy

log = logging.getLogger("maze_cli")


@dataclass
class ReplayConfig:
    """The keys every off-policy algorithm (SAC, TD3, DQN) takes: what `replay_run` builds its workers
    and its loop from. Each algorithm's config adds its own and may change a default."""

    _target_: str = ""
    lr: PositiveFloat = key(3e-4, "Adam's learning rate")
    gamma: Fraction = key(0.99, "discount")
    tau: Annotated[float, Gt(0), Le(1)] = key(0.005, "Polyak averaging of the target networks (1: a copy)")
    n_rollout_steps: PositiveInt = key(8, "steps per worker rollout")
    rollouts_per_iteration: PositiveInt = key(1, "rollouts moved into the replay buffer per learner iteration")
    batch_size: PositiveInt = key(256, "transitions per gradient update (whole rollouts when not splitting)")
    replay_ratio: PositiveFloat = key(1.0, "gradient updates per collected transition")
    initial_buffer_size: NonNegativeInt = key(1000,
                                               "transitions collected by the initial sampling policy before learning")
    initial_sampling_policy: Any = key(None,
                                        "null or random: uniform random actions; a checkpoint path "
                                        "(.../checkpoints/last.pt, trained on this env's spaces); or a mapping with "
                                        "_target_ (called with observation_space, action_space and its other keys)")


def check_single_agent(parts: Components, algorithm: str) -> None:
    """A replay buffer holds one agent's transitions: a multi-agent env is refused in one line."""
    if parts.env_factory.agents:  # finished agents' steps are no transitions for the buffer
        raise ConfigError(f"algorithm={algorithm}: a multi-agent (PettingZoo) env trains with algorithm=impala, appo or ppo; "
                          f"{algorithm.upper()}'s replay buffer takes single-agent envs only")


def check_feed_forward(policy: Policy, parts: Components, algorithm: str) -> None:
    if policy.is_recurrent:
        raise ConfigError(f"algorithm={algorithm} takes feed-forward policy networks only; policy._target_="
                          f"{parts.network['_target_']} is recurrent (use algorithm=impala, appo or ppo for a recurrent core)")


def replay_run(parts: Components, learner: Learner, hp: ReplayConfig, blueprint: dict[str, object],
               split_rollouts_into_transitions: bool = True, n_step: int = 1) -> Run:
    """The run of an off-policy algorithm: actors that step their envs one by one (no autoreset
    steps, so every step is a transition) and fill the replay buffer, first with the initial
    sampling policy (`hp.initial_sampling_policy`: uniform random, a checkpoint or a class), and the
    replay loop. `hp` has the replay keys: n_rollout_steps, rollouts_per_iteration, batch_size,
    initial_buffer_size, replay_ratio (and gamma, for `n_step` > 1: n-step transitions)."""
    policy = learner.policy
    initial = initial_sampling_policy(hp.initial_sampling_policy, parts.observation_space, parts.action_space, parts.load_policy)
    source = "uniform random actions" if initial is None else f"{type(initial).__name__} ({hp.initial_sampling_policy})"
    log.info(f"the replay buffer's first {hp.initial_buffer_size:,} transitions: {source} (algorithm.initial_sampling_policy)")
    one_by_one = parts.env_factory.without_vectorization()  # no autoreset steps: every step is a transition
    actors = parts.make_actors(policy=policy, n_rollout_steps=hp.n_rollout_steps, env_factory=one_by_one,
                               batch_size=hp.rollouts_per_iteration, initial_policy=initial_sampling_policy_or_random(policy, initial))
    workers = BaseDistributedWorkersWithBuffer(actors, parts.make_replay_buffer, batch_size=hp.batch_size,
                                               initial_buffer_size=hp.initial_buffer_size,
                                               split_rollouts_into_transitions=split_rollouts_into_transitions,
                                               n_step=n_step, gamma=hp.gamma if n_step > 1 else 1.0)
    return Run(ReplayLoop(workers, learner, hp.replay_ratio), workers, learner, blueprint)
