"""Evaluation: deterministic episodes on the learner's own envs, seeded apart from the actors'.

Runs in the learner's process between epochs; subprocess and Ray actors keep collecting meanwhile
(up to their queue bound). Every evaluation replays the same episode seeds, so returns are
comparable from one evaluation to the next and `best.pt` is chosen on like terms. With
`eval.background` it runs in a thread of its own on a snapshot of the weights, off the learner's
critical path (`BackgroundEvaluation`).
"""

from __future__ import annotations

import contextlib
import copy
import math
import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, NamedTuple

import gymnasium as gym
import numpy as np
import torch
from torch import nn

from maze_cli.envs.info_stats import EpisodeInfoStats, epoch_means, raise_error
from maze_cli.envs.multiagent import run_team_episodes
from maze_cli.envs.source import EnvSource, as_env_source
from maze_cli.envs.spaces import ObservationWriter, action_to_env, observation_specs

log = logging.getLogger(__name__)


class Episodes(NamedTuple):
    """What `run_episodes` played: each episode's return and length, and how many of them it cut short at
    `max_steps` (an env with no time limit of its own, whose policy never ends an episode)."""

    returns: list[float]
    lengths: list[int]
    cut_short: int = 0


@contextlib.contextmanager
def eval_mode(policy: nn.Module) -> Iterator[nn.Module]:
    """The policy in eval mode while the block runs (observation statistics frozen), as it was after."""
    was_training = policy.training
    policy.eval()
    try:
        yield policy
    finally:
        policy.train(was_training)


def run_episodes(
    env_factory: EnvSource | Callable[[], gym.Env], policy: nn.Module, seeds: list[int], deterministic: bool = True,
    device: str | torch.device = "cpu", on_frame: Callable[[int, gym.Env], None] | None = None,
    episode_info: EpisodeInfoStats | None = None, max_steps: int | None = None,
) -> Episodes:
    """One episode per seed, all envs stepped together with one batched forward pass per step.

    `on_frame(i, env)` is called after each step of episode i (for rendering). `episode_info` (one
    column per seed) follows the env statistics. An episode the env has not ended after `max_steps`
    steps ends there, its return as it stood: an env without a time limit, whose policy's most likely
    action loops, would otherwise never let the evaluation end. A multi-agent env plays all its agents;
    its returns are then the agents' (`run_team_episodes`).
    """
    source = as_env_source(env_factory)
    if source.agents:
        return Episodes(*run_team_episodes(source.parallel_env, len(source.agents), policy, seeds, deterministic, device,
                                           episode_info, f"env._target_={source.describe()}", on_frame, max_steps))
    envs = [source() for _ in seeds]
    try:
        writer = ObservationWriter(envs[0].observation_space)
        specs = observation_specs(envs[0].observation_space)
        obs = {k: torch.zeros((len(envs),) + s.shape, dtype=s.dtype) for k, s in specs.items()}
        writer.write([env.reset(seed=s)[0] for env, s in zip(envs, seeds)], obs)
        returns = np.zeros(len(envs))
        lengths = np.zeros(len(envs), dtype=np.int64)
        running = np.ones(len(envs), dtype=bool)
        cut_short = 0
        state = tuple(s.to(device) for s in policy.initial_state(len(envs)))
        starts = torch.ones(len(envs), dtype=torch.bool, device=device)
        no_starts = torch.zeros_like(starts)  # each env plays one episode: only its first step starts one
        while running.any():
            with torch.no_grad():
                actions, _, state = policy.act({k: v.to(device) for k, v in obs.items()}, state, starts, deterministic=deterministic)
            starts = no_starts
            actions = actions.cpu().numpy()
            infos, ended = {}, np.zeros(len(envs), dtype=bool)
            for i in np.flatnonzero(running):
                o, r, terminated, truncated, infos[i] = envs[i].step(action_to_env(envs[i].action_space, actions[i]))
                ended[i] = terminated or truncated
                returns[i] += r
                lengths[i] += 1
                writer.write_one(o, i, obs)
                if on_frame is not None:
                    on_frame(i, envs[i])
                if not ended[i] and max_steps is not None and lengths[i] >= max_steps:
                    ended[i], cut_short = True, cut_short + 1
                running[i] = not ended[i]
            if episode_info is not None:
                episode_info.observe(infos, ended)
        return Episodes(returns.tolist(), lengths.tolist(), cut_short)
    finally:
        for env in envs:
            env.close()


@contextlib.contextmanager
def seeded_sampling(deterministic: bool, seed: int, device: str | torch.device = "cpu") -> Iterator[None]:
    """Unless `deterministic` (nothing is drawn then): sampled actions drawn from torch's RNG seeded with
    `seed`, and the RNG as it was afterwards: the same weights sample the same episodes at every
    evaluation, and training's random stream is untouched. In a thread other than the main one
    (eval.background) the RNG is shared with the learner, which draws from it meanwhile: there the
    samples follow the learner's stream."""
    if deterministic or threading.current_thread() is not threading.main_thread():
        yield
        return
    devices = [torch.device(device)] if torch.device(device).type == "cuda" else []
    with torch.random.fork_rng(devices=devices):
        torch.manual_seed(seed)
        yield


class Evaluator:
    """`episodes` episodes with seeds derived once from `seed`, the policy acting as `deterministic`
    says (sampled actions seeded by the first episode seed), each at most `max_episode_steps` long."""

    def __init__(self, env_factory: EnvSource | Callable[[], gym.Env], episodes: int, seeds: list[int], device: str = "cpu",
                 deterministic: bool = True, max_episode_steps: int | None = None):
        self.env_factory = as_env_source(env_factory)
        self.seeds = seeds[:episodes]
        self.device = device
        self.deterministic = deterministic
        self.max_episode_steps = max_episode_steps
        self.info_stats = dict(self.env_factory.info_stats)
        self._said_cut_short = False

    def __call__(self, policy: nn.Module) -> dict[str, float]:
        if self.env_factory.turn_based:
            return self._against_opponents(policy)
        episode_info = EpisodeInfoStats(self.info_stats, len(self.seeds))
        with eval_mode(policy), seeded_sampling(self.deterministic, self.seeds[0], self.device):
            returns, lengths, cut_short = run_episodes(self.env_factory, policy, self.seeds, self.deterministic, self.device,
                                                       episode_info=episode_info, max_steps=self.max_episode_steps)
        raise_error(episode_info.error)
        if cut_short and not self._said_cut_short:
            self._said_cut_short = True
            sampled_key = "eval.deterministic" if self.deterministic else None
            log.warning(f"evaluation: {cut_short_message(cut_short, len(self.seeds), self.max_episode_steps, 'eval.max_episode_steps', sampled_key)}")
        mean = sum(returns) / len(returns)
        return {
            "eval/return_mean": mean,
            "eval/return_std": math.sqrt(sum((r - mean) ** 2 for r in returns) / len(returns)),
            "eval/episode_length_mean": sum(lengths) / len(lengths),
            **epoch_means(episode_info.take(), "eval"),
        }

    def _against_opponents(self, policy: nn.Module) -> dict[str, float]:
        """A turn-based game: the policy against each fixed opponent (`maze_cli.envs.turn_based`), one game per
        eval seed, half in each seat; `eval/return_mean` is its mean return over all of them (win 1, loss -1)."""
        from maze_cli.envs.turn_based import OPPONENTS, play_against

        stats, returns = {}, []
        with eval_mode(policy), seeded_sampling(self.deterministic, self.seeds[0], self.device):
            for opponent in OPPONENTS:
                result = play_against(self.env_factory.parallel_env, policy, opponent, self.seeds, self.device, self.deterministic)
                returns.append(result.pop("return"))
                stats.update({f"eval/{rate}/{opponent}": value for rate, value in result.items()})
        return {"eval/return_mean": sum(returns) / len(returns), **stats}


def cut_short_message(cut_short: int, episodes: int, max_steps: int | None, steps_key: str, sampled_key: str | None) -> str:
    """Episodes the env did not end were cut at the step limit: how many, and what to do (said once a run,
    and by `rollout`). `sampled_key`, where the policy took its most likely actions: the key that samples them."""
    loops = f"; a policy whose most likely action loops is judged by its samples with {sampled_key}=false" if sampled_key else ""
    return (f"{cut_short} of {episodes} episodes had not ended after {steps_key}={max_steps:,} steps and were cut short "
            f"there, their returns as they stood (the env has no time limit of its own, or a longer one{loops}; "
            f"env.max_episode_steps=<n> gives the env one, in training too)")


@dataclass
class Snapshot:
    """The policy as it was at the end of an epoch, evaluated while the learner trains on."""

    policy: nn.Module
    epoch: int
    env_steps: int
    stats: dict[str, Any] = field(default_factory=dict)
    error: BaseException | None = None
    seconds: float = 0.0  # the evaluation's wall time, in its own thread


class BackgroundEvaluation:
    """Evaluates snapshots of the policy in a daemon thread, one at a time, so the learner does not wait
    for the episodes: worth it where a core is idle (evaluation steps envs in Python, and on a machine
    whose cores the actors and learner already fill it only moves the wait elsewhere). The learner
    takes each result at a later epoch's end; `best.pt` is then written from the snapshot's weights."""

    def __init__(self, evaluate: Callable[[Snapshot], dict[str, Any]], policy: Callable[[], nn.Module]):
        self._evaluate = evaluate
        self._policy = policy  # the learner's live policy, copied at each start
        self._pending: Snapshot | None = None
        self._done = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def busy(self) -> bool:
        return self._pending is not None

    def start(self, epoch: int, env_steps: int) -> float:
        """Copy the policy and evaluate the copy in the background; returns the seconds the copy took
        (the only part of the evaluation on the learner's path)."""
        t0 = time.perf_counter()
        snapshot = Snapshot(copy.deepcopy(self._policy()), epoch, env_steps)
        copied = time.perf_counter() - t0
        self._pending = snapshot
        self._done.clear()
        self._thread = threading.Thread(target=self._run, args=(snapshot,), name="maze-eval", daemon=True)
        self._thread.start()
        return copied

    def _run(self, snapshot: Snapshot) -> None:
        start = time.perf_counter()
        try:
            snapshot.stats = self._evaluate(snapshot)
        except BaseException as err:  # noqa: BLE001 - handed to the learner's thread, which decides
            snapshot.error = err
        snapshot.seconds = time.perf_counter() - start
        self._done.set()

    def take(self, wait: bool = False) -> Snapshot | None:
        """The finished evaluation's snapshot (None while it runs, or if none was started); `wait`:
        block until it finishes."""
        if self._pending is None or not (self._done.wait() if wait else self._done.is_set()):
            return None
        snapshot, self._pending = self._pending, None
        return snapshot
