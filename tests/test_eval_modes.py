"""How evaluation acts (eval.deterministic): the most likely action, or sampled and seeded; a policy whose most
likely action loops is judged by what it learned when sampled; rollout acts as the run's evaluation did."""

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


def evaluate(deterministic: bool, seeds=tuple(range(20))) -> dict:
    return Evaluator(Corridor, len(seeds), list(seeds), deterministic=deterministic)(PrefersToWait())


def test_a_policy_whose_most_likely_action_loops_is_judged_by_its_samples():
    greedy, sampled = evaluate(True), evaluate(False)
    assert greedy["eval/return_mean"] == 0.0 and greedy["eval/episode_length_mean"] == 20
    assert sampled["eval/return_mean"] >= 0.9


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
