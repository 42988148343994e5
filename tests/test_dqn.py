"""The DQN family (maze_cli/algorithms/dqn.py): n-step transitions, its update on the shared
learner, epsilon-greedy and Ape-X exploration, its runs and its refusals."""

from __future__ import annotations

import gymnasium as gym
import pytest
import torch

from maze_cli.algorithms.dqn import Dqn, DqnObjective, DqnPolicy, apex_epsilons
from maze_cli.learner import Learner
from maze_cli.parallel.sequential import SequentialDistributedActors
from maze_cli.records import Rollout, Transitions
from tests.cli import run_train
from tests.envs import CountingEnv
from tests.learner_cases import CARTPOLE, transitions
from tests.test_cli_errors import assert_one_line_error
from tests.test_checkpoints import rollout
from tests.test_cnn import pixel_env_config
from tests.test_multiagent import env_config
from tests.test_train import read_stats

NETWORK = {"_target_": "maze_cli.policies.mlp.MlpNetwork", "hidden_sizes": [16, 16], "activation": "relu"}


def _learner(**hp) -> Learner:
    torch.manual_seed(3)
    config = Dqn(**hp)
    policy = DqnPolicy(*CARTPOLE, NETWORK, dueling=config.dueling)
    return Learner(DqnObjective(policy, config))


def _rollout(rewards: list[float], terminated: list[bool], truncated: list[bool]) -> Rollout:
    """One env's rollout `[T, 1]` whose observation at step t is t (the final observation of a
    truncated episode at step t is 100 + t)."""
    T = len(rewards)
    column = lambda values, dtype: torch.tensor(values, dtype=dtype).reshape(T, 1)  # noqa: E731
    observations = torch.arange(T + 1, dtype=torch.float32).reshape(T + 1, 1, 1)
    finals = (100 + torch.arange(T, dtype=torch.float32)).reshape(T, 1, 1)
    return Rollout(observations={"obs": observations}, actions=torch.zeros(T, 1, dtype=torch.int64),
                   behaviour_logp=torch.zeros(T, 1), rewards=column(rewards, torch.float32),
                   terminated=column(terminated, torch.bool), truncated=column(truncated, torch.bool),
                   autoreset=torch.zeros(T, 1, dtype=torch.bool), final_observations={"obs": finals},
                   policy_version=torch.zeros(1, dtype=torch.int64))


def test_n_step_transitions_sum_discounted_rewards_and_stop_at_the_episode_and_the_rollouts_end():
    # steps 0-1: an episode that terminates at step 1; 2-4: one truncated at step 4; 5-6: cut by the rollout's end
    rollout = _rollout([1, 2, 3, 4, 5, 6, 7], [False, True, False, False, False, False, False],
                       [False, False, False, False, True, False, False])
    t = Transitions.from_rollout(rollout, n_step=3, gamma=0.5)
    assert t.horizon.tolist() == [2, 1, 3, 2, 1, 2, 1]
    assert t.rewards.tolist() == [1 + 0.5 * 2, 2, 3 + 0.5 * 4 + 0.25 * 5, 4 + 0.5 * 5, 5, 6 + 0.5 * 7, 7]
    assert t.terminated.tolist() == [True, True, False, False, False, False, False]
    # the successor after the window: the truncated episode's final observation (104), else the next step's
    assert t.next_observations["obs"].flatten().tolist() == [2, 2, 104, 104, 104, 7, 7]
    single = Transitions.from_rollout(rollout)
    assert single.horizon is None and single.rewards.tolist() == [1, 2, 3, 4, 5, 6, 7]
    assert single.next_observations["obs"].flatten().tolist() == [1, 2, 3, 4, 104, 6, 7]


def test_the_target_network_follows_every_target_update_interval_updates_and_the_q_network_every_update():
    learner = _learner(target_update_interval=3)
    objective, batch = learner.objective, transitions(CARTPOLE)
    moved = []
    for _ in range(6):
        before = [p.detach().clone() for p in objective.target.parameters()]
        online = [p.detach().clone() for p in objective.policy.parameters()]
        metrics = learner.update(batch)
        moved.append((any(not torch.equal(a, b) for a, b in zip(online, objective.policy.parameters())),
                      any(not torch.equal(a, b) for a, b in zip(before, objective.target.parameters()))))
        assert torch.isfinite(torch.as_tensor(metrics["td_loss"]))
    assert [m[0] for m in moved] == [True] * 6
    assert [m[1] for m in moved] == [False, False, True, False, False, True]
    after = dict(objective.target.named_parameters())
    assert all(torch.equal(p, after[name]) for name, p in objective.policy.named_parameters())  # copied (tau=1)
    assert objective.priorities().shape == (32,)


def test_double_q_values_the_online_networks_choice_with_the_target_network():
    learner = _learner(double_q=True, n_step=1, gamma=0.9)
    objective = learner.objective
    with torch.no_grad():  # the target network disagrees with the online one: it prefers the other action
        for p in objective.target.parameters():
            p.add_(torch.randn_like(p))
    tr = transitions(CARTPOLE).transitions
    discount = torch.full_like(tr.rewards, 0.9)
    _, td, _ = objective.td_loss(tr.observations, tr.actions, tr.rewards, tr.next_observations, tr.terminated, discount,
                                 torch.ones_like(tr.rewards))
    with torch.no_grad():
        q = objective.policy.q(tr.observations).gather(-1, tr.actions.unsqueeze(-1)).squeeze(-1)
        choice = objective.policy.q(tr.next_observations).argmax(-1, keepdim=True)
        v_next = objective.target.q(tr.next_observations).gather(-1, choice).squeeze(-1)
    expected = q - (tr.rewards + 0.9 * (~tr.terminated).float() * v_next)
    assert torch.allclose(td, expected, atol=1e-5)
    plain = _learner(double_q=False, n_step=1, gamma=0.9).objective
    plain.target.load_state_dict(objective.target.state_dict())
    plain.policy.load_state_dict(objective.policy.state_dict())
    _, td_plain, _ = plain.td_loss(tr.observations, tr.actions, tr.rewards, tr.next_observations, tr.terminated, discount,
                                   torch.ones_like(tr.rewards))
    assert (td_plain <= td + 1e-6).all() and not torch.allclose(td_plain, td)  # max over Q' is the higher target


def test_epsilon_falls_linearly_with_the_env_steps_and_acting_is_greedy_when_deterministic():
    learner = _learner(initial_epsilon=1.0, final_epsilon=0.1, epsilon_steps=1000)
    policy, batch = learner.policy, transitions(CARTPOLE)
    assert float(policy.epsilon) == 1.0
    learner.env_steps = 500
    learner.update(batch)
    assert float(policy.epsilon) == pytest.approx(0.55)
    learner.env_steps = 5000
    learner.update(batch)
    assert float(policy.epsilon) == pytest.approx(0.1)
    obs = {"obs": torch.randn(2000, 4)}
    greedy, logp, _ = policy.act(obs, deterministic=True)
    assert torch.equal(greedy, policy.q(obs).argmax(-1)) and torch.equal(logp, torch.zeros(2000))
    explored = (policy.act(obs)[0] != greedy).float().mean()
    assert 0.02 < explored < 0.08  # epsilon 0.1, half of the random actions are the greedy one
    policy.epsilon.fill_(1.0)
    assert 0.45 < (policy.act(obs)[0] != greedy).float().mean() < 0.55


def test_apex_gives_each_env_of_the_run_its_own_epsilon_and_learners_shares_go_on_from_each_other():
    eps = apex_epsilons(range(8), 8, 0.4, 7.0)
    assert eps[0] == pytest.approx(0.4) and eps[-1] == pytest.approx(0.4 ** 8)
    assert (eps[1:] < eps[:-1]).all()
    policy = DqnPolicy(gym.spaces.Box(0.0, 5.0, (1,)), gym.spaces.Discrete(2), NETWORK, exploration="apex")
    # the second learner's share: actors 2 and 3 of the run's 4, two envs each
    actors = SequentialDistributedActors(CountingEnv, policy, n_rollout_steps=4, n_actors=2, batch_size=1, envs_per_actor=2,
                                         first_actor=2, run_actors=4)
    with actors:
        epsilons = [actor.policy.env_epsilons for actor in actors.actors]
    assert torch.allclose(torch.cat(epsilons), apex_epsilons(range(4, 8), 8, 0.4, 7.0))
    assert policy.env_epsilons is None  # the learner's policy acts greedily in evaluation; only actors' copies explore


@pytest.mark.slow
@pytest.mark.parametrize("runner", ["sequential", "subproc"])
def test_dqn_learns_cartpole(tmp_path, runner):
    run_dir = tmp_path / "run"
    result = run_train("+env=cartpole", "algorithm=dqn", f"runner={runner}", "max_env_steps=60000", "target_return=300",
                       run_dir=run_dir, timeout=400)
    assert result.returncode == 0, result.stderr
    stats = read_stats(run_dir)
    assert max(row.get("eval/return_mean", 0) for row in stats) >= 300, [row.get("eval/return_mean") for row in stats]
    assert 0.04 - 1e-6 <= stats[-1]["learner/epsilon"] < 1.0  # falling from 1 towards tuning/cartpole_dqn.yaml's 0.04


@pytest.mark.slow
def test_apex_workers_with_prioritized_replay_learn_cartpole(tmp_path):
    run_dir = tmp_path / "run"
    result = run_train("+env=cartpole", "algorithm=dqn", "algorithm.exploration=apex", "replay_buffer=prioritized",
                       "runner=subproc", "runner.n_actors=2", "max_env_steps=60000", "target_return=300", run_dir=run_dir,
                       timeout=400)
    assert result.returncode == 0, result.stderr
    assert max(row.get("eval/return_mean", 0) for row in read_stats(run_dir)) >= 300


def test_dict_observations_and_pixels_train_and_the_checkpoint_plays(tmp_path):
    dict_env = env_config(tmp_path, _target_="tests.envs.CountingEnv", obs_kind="dict", length=6)
    result = run_train(*dict_env, "algorithm=dqn", "runner=sequential", "max_env_steps=1500",
                       "algorithm.initial_buffer_size=200", run_dir=tmp_path / "dict", timeout=200)
    assert result.returncode == 0, result.stderr
    played = rollout(f"checkpoint={tmp_path / 'dict' / 'checkpoints' / 'last.pt'}", "episodes=2", "allow=[tests.envs.CountingEnv]")
    assert played.returncode == 0, played.stderr
    pixels = run_train("--config-dir", pixel_env_config(tmp_path / "pixels_config"), "+env=pixels", "policy=cnn", "policy.encoder=small",
                       "algorithm=dqn", "runner=sequential", "max_env_steps=1500", "algorithm.initial_buffer_size=200",
                       run_dir=tmp_path / "pixels", timeout=200)
    assert pixels.returncode == 0, pixels.stderr
    assert read_stats(tmp_path / "pixels")[-1]["learner/updates"] > 0


def test_a_resumed_learner_goes_on_with_its_target_optimizer_and_epsilon():
    learner, batch = _learner(target_update_interval=2), transitions(CARTPOLE)
    learner.env_steps = 4000
    for _ in range(3):
        learner.update(batch)
    restored = _learner(target_update_interval=2)
    restored.load_state_dict(learner.state_dict())
    assert float(restored.policy.epsilon) == float(learner.policy.epsilon) < 1.0
    for _ in range(2):
        learner.update(batch)
        restored.update(batch)
    for name, module in learner.objective.modules().items():
        for a, b in zip(module.parameters(), restored.objective.modules()[name].parameters()):
            assert torch.equal(a, b), name


@pytest.mark.parametrize("env, overrides, expected", [
    ("+env=pendulum", [], "algorithm=dqn takes Discrete actions, not Box"),
    ("+env=simple_spread", [], "algorithm=dqn: a multi-agent (PettingZoo) env"),
    ("+env=cartpole", ["policy.core=lstm"], "algorithm=dqn takes feed-forward policy networks only"),
    ("+env=cartpole", ["algorithm.exploration=boltzmann"], "algorithm.exploration"),
])
def test_what_dqn_cannot_train_is_refused_in_one_line(tmp_path, env, overrides, expected):
    result = run_train(env, "algorithm=dqn", "runner=sequential", "max_env_steps=100", *overrides, run_dir=tmp_path / "run")
    assert_one_line_error(result, expected)
    assert not (tmp_path / "run" / "checkpoints" / "last.pt").exists()


def test_multidiscrete_actions_are_refused_in_one_line(tmp_path):
    env = env_config(tmp_path, _target_="tests.envs.CountingEnv", action_kind="multidiscrete")
    result = run_train(*env, "algorithm=dqn", "runner=sequential", "max_env_steps=100", run_dir=tmp_path / "run")
    assert_one_line_error(result, "algorithm=dqn takes Discrete actions, not MultiDiscrete")


def test_dqns_loss_equals_the_papers_formula_computed_by_hand():
    """The importance-weighted Huber loss of n-step double-Q targets (van Hasselt et al. 2016; Horgan
    et al. 2018 for the n-step returns and the weights), from the Q-networks' outputs alone:
        y = R + gamma^h (1 - d) Q'(s', argmax_a Q(s', a)),  L = E[w huber(Q(s, a) - y)]
    where R sums the h <= n rewards between s and s'."""
    from maze_cli.contract import UpdateContext
    from maze_cli.parallel.workers_with_buffer import SampledBatch

    learner = _learner(double_q=True, n_step=3, gamma=0.9)
    objective = learner.objective
    with torch.no_grad():
        for p in objective.target.parameters():
            p.add_(torch.randn_like(p) * 0.3)
    sampled = transitions(CARTPOLE)
    n = len(sampled.transitions)
    tr = Transitions(**{**vars(sampled.transitions), "rewards": sampled.transitions.rewards * 3,
                        "horizon": torch.randint(1, 4, (n,), generator=torch.Generator().manual_seed(0)).to(torch.int16)})
    batch = SampledBatch(tr, sampled.indices, sampled.weights, 1)
    (step,) = objective.steps(batch, UpdateContext(torch.device("cpu"), 0, 0, 1.0, {}))

    with torch.no_grad():
        choice = objective.policy.q(tr.next_observations).argmax(-1, keepdim=True)
        v_next = objective.target.q(tr.next_observations).gather(-1, choice).squeeze(-1)
        y = tr.rewards + 0.9 ** tr.horizon.float() * (~tr.terminated).float() * v_next
    error = objective.policy.q(tr.observations).gather(-1, tr.actions.unsqueeze(-1)).squeeze(-1) - y
    huber = torch.where(error.abs() < 1, 0.5 * error ** 2, error.abs() - 0.5)
    assert (error.abs() >= 1).any() and (error.abs() < 1).any()  # both of Huber's pieces are in the batch
    assert len(set(tr.horizon.tolist())) == 3
    torch.testing.assert_close(step.losses["q"], (batch.weights * huber).mean(), rtol=1e-5, atol=1e-6)
