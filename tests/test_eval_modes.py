"""How evaluation acts (eval.deterministic): the most likely action, or sampled and seeded; a policy whose most
likely action loops is judged by what it learned when sampled; an episode the env never ends is cut short
(eval.max_episode_steps); rollout acts as the run's evaluation did."""

import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch

from maze_cli.evaluation import Evaluator
from maze_cli.policies.base import Policy
from maze_cli.policies.distributions import Categorical
from tests.cli import REPO, run_train

ROLLOUT = Path(sys.executable).with_name("rollout")


class Corridor(gym.Env):
    """Three `advance` actions (1) reach the goal (reward 1); `wait` (0) stays put; truncated after 20 steps.
    The observation never changes, so a memoryless policy that prefers to wait waits forever if it
    always takes its most likely action."""

    observation_space = gym.spaces.Box(0.0, 1.0, (1,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.position, self.t = 0, 0
        return np.zeros(1, np.float32), {}

    def step(self, action):
        self.position += int(action)
        self.t += 1
        reached = self.position >= 3
        return np.zeros(1, np.float32), float(reached), reached, self.t >= 20 and not reached, {}


class PrefersToWait(Policy):
    """Fixed probabilities: wait 0.6, advance 0.4 (a stochastic policy that reaches the goal, whose mode never does)."""

    def __init__(self):
        super().__init__()
        self.observation_space, self.action_space = Corridor.observation_space, Corridor.action_space
        self.distribution = Categorical(2)
        self.logits = torch.nn.Parameter(torch.log(torch.tensor([0.6, 0.4])))

    def initial_state(self, batch_size):
        return ()

    def forward(self, observations, state, episode_start):
        raise NotImplementedError

    def action_params(self, observations, state, episode_start):
        return self.logits.expand(observations["obs"].shape[0], 2), state


class EndlessCorridor(Corridor):
    """Fault injection: the corridor without its time limit, as an env that registers none; a policy whose most likely
    action is to wait never ends an episode."""

    def step(self, action):
        observation, reward, terminated, _, info = super().step(action)
        return observation, reward, terminated, False, info


def evaluate(deterministic: bool, seeds=tuple(range(20))) -> dict:
    return Evaluator(Corridor, len(seeds), list(seeds), deterministic=deterministic)(PrefersToWait())


def test_a_policy_whose_most_likely_action_loops_is_judged_by_its_samples():
    greedy, sampled = evaluate(True), evaluate(False)
    assert greedy["eval/return_mean"] == 0.0 and greedy["eval/episode_length_mean"] == 20
    assert sampled["eval/return_mean"] >= 0.9


def test_an_episode_the_env_never_ends_is_cut_short_and_said_once(caplog):
    evaluator = Evaluator(EndlessCorridor, 4, list(range(4)), deterministic=True, max_episode_steps=50)
    with caplog.at_level(logging.WARNING, logger="maze_cli.evaluation"):
        first, second = evaluator(PrefersToWait()), evaluator(PrefersToWait())
    assert first == second and first["eval/episode_length_mean"] == 50 and first["eval/return_mean"] == 0.0
    said = [r.getMessage() for r in caplog.records if "cut short" in r.getMessage()]
    assert len(said) == 1, said
    assert said[0].startswith("evaluation: 4 of 4 episodes had not ended after eval.max_episode_steps=50 steps")
    assert "eval.deterministic=false" in said[0] and "env.max_episode_steps=<n>" in said[0]
    sampled = Evaluator(EndlessCorridor, 20, list(range(20)), deterministic=False, max_episode_steps=50)(PrefersToWait())
    assert sampled["eval/return_mean"] >= 0.9 and sampled["eval/episode_length_mean"] < 50  # these episodes end


def test_a_team_episode_the_env_never_ends_is_cut_short_with_the_returns_it_had():
    pytest.importorskip("pettingzoo")
    from maze_cli.envs import EnvFactory
    from maze_cli.policies import ActorCritic, mlp_network

    endless = EnvFactory({"_target_": "tests.envs.signal_team_env", "length": 10**9})
    policy = ActorCritic(*endless.check(), mlp_network((8,)))
    cut = Evaluator(endless, 3, [0, 1, 2], deterministic=False, max_episode_steps=7)(policy)
    assert cut["eval/episode_length_mean"] == 7 and 0 < cut["eval/return_mean"] < 7
    assert cut["eval/env/team_return"] == pytest.approx(2 * cut["eval/return_mean"])  # each agent's return is the team's
    ending = EnvFactory({"_target_": "tests.envs.signal_team_env", "length": 7})  # the same episodes, ended by the env
    assert Evaluator(ending, 3, [0, 1, 2], deterministic=False)(policy) == cut


def test_sampled_evaluation_is_seeded_and_leaves_training_randomness_alone():
    torch.manual_seed(123)
    first = evaluate(False)
    after_first = torch.rand(3)
    torch.manual_seed(123)
    second = evaluate(False)
    assert first == second  # the same weights play the same episodes
    assert torch.equal(torch.rand(3), after_first)
    torch.manual_seed(123)
    assert torch.equal(torch.rand(3), after_first)  # as if no evaluation had drawn from the RNG
    assert evaluate(False, seeds=tuple(range(20, 40))) != first


@pytest.mark.parametrize("setting, greedy", [("false", False), ("true", True)])
def test_rollout_acts_as_the_runs_evaluation_did(tmp_path, setting, greedy):
    """A short run, then `rollout` with no deterministic= : the run's own eval.deterministic decides."""
    run_dir = tmp_path / "run"
    result = run_train("+env=cartpole", "runner=sequential", "max_env_steps=2000", f"eval.deterministic={setting}", run_dir=run_dir)
    assert result.returncode == 0, result.stderr[-2000:]
    out = subprocess.run([str(ROLLOUT), f"checkpoint={run_dir / 'checkpoints' / 'last.pt'}", "episodes=2"], capture_output=True,
                         text=True, timeout=120, cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(REPO)}, stdin=subprocess.DEVNULL)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.splitlines()[1] == f"actions: {'the most likely' if greedy else 'sampled'}"


def test_a_run_on_an_env_that_never_ends_an_episode_finishes_and_its_rollout_too(tmp_path):
    """No episode of this env ever ends: the run's evaluations and `rollout` end all the same, each episode cut at
    eval.max_episode_steps (rollout: as the run's, or its own max_episode_steps=)."""
    configs = tmp_path / "configs" / "env"
    configs.mkdir(parents=True)
    (configs / "endless.yaml").write_text("# @package _global_\nenv:\n  _target_: tests.envs.CountingEnv\n  length: 1000000000\n"
                                          "target_return: null\n")
    run_dir = tmp_path / "run"
    result = run_train("--config-dir", str(tmp_path / "configs"), "+env=endless", "runner=sequential", "max_env_steps=6000",
                       "epoch_length=2", "eval.max_episode_steps=60", "eval.episodes=3", run_dir=run_dir, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    rows = [json.loads(line) for line in (run_dir / "stats.jsonl").read_text().splitlines()]
    assert len(rows) >= 2 and all(row["eval/episode_length_mean"] == 60 and row["eval/return_mean"] == 60 for row in rows)
    assert result.stdout.count("had not ended after eval.max_episode_steps=60 steps") == 1, result.stdout  # once a run

    def rollout(*args: str) -> str:
        out = subprocess.run([str(ROLLOUT), f"checkpoint={run_dir / 'checkpoints' / 'last.pt'}", "episodes=2",
                              "allow=[tests.envs.CountingEnv]", *args], capture_output=True, text=True, timeout=120, cwd=tmp_path,
                             env={**os.environ, "PYTHONPATH": str(REPO)}, stdin=subprocess.DEVNULL)
        assert out.returncode == 0, out.stderr[-2000:]
        return out.stdout

    assert "episode length 60.0" in rollout() and "2 of 2 episodes had not ended after max_episode_steps=60" in rollout()
    assert "episode length 25.0" in rollout("max_episode_steps=25")
