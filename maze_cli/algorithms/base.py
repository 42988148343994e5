"""What an algorithm is to maze_cli: a class (its hyperparameters are its fields) that builds a run.

An algorithm is one file plus one config file. Its class subclasses its config dataclass (the
single source of its defaults, registered with Hydra) and `Algorithm`, and builds its `Run` from the
`Components` the builder made from the other config groups: the env, the policy network's config,
and factories for the actors and the replay buffer. It never reads the config itself. Its update is
an `Objective` (maze_cli/contract.py) that a `Learner` runs, inside one of the two loops.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, ClassVar, TypedDict

import gymnasium as gym

from maze_cli.envs.source import EnvSource

if TYPE_CHECKING:
    from maze_cli.contract import Loop, Runner
    from maze_cli.buffers import ReplayBuffer
    from maze_cli.distributed import LearnerGroup
    from maze_cli.learner import Learner
    from maze_cli.parallel.distributed_actors import DistributedActors
    from maze_cli.policies.base import Policy


class LearnerOptions(TypedDict, total=False):
    """The shared learner's options from the config (`maze_cli.learner.Learner`'s keyword arguments)."""

    precision: str
    compile: bool
    compile_mode: str
    group: "LearnerGroup | None"
    max_env_steps: int
    max_time_s: float | None


@dataclass
class Components:
    """The parts an algorithm builds its run from.

    `env_factory` is the run's `EnvSource` (`maze_cli.envs.source`): e.g. `agents` says whether the
    env is multi-agent, `without_vectorization()` gives envs stepped one by one for a replay buffer.
    `make_actors(policy=..., n_rollout_steps=..., **more)` builds the runner's `DistributedActors`
    (its class and options from the `runner` group, seeds and envs per actor filled in); an algorithm
    may override any argument (e.g. `batch_size`, `initial_policy`, `env_factory`).
    `make_replay_buffer(item_specs=...)` builds the `replay_buffer` group's buffer.
    `network` is the `policy` group's config (`_target_` and arguments, the algorithm's
    `network_defaults` filled in where the config left null).
    `load_policy(path, where)` reads a checkpoint's policy, safely (allow-list) and checked against
    this env's spaces; `where` names the config key in its error messages.
    `action_mask_key`: the observation key of the action mask that `env.action_mask_key` names or that was
    found (None: no mask); an algorithm hands it to its policy, which applies it to every distribution.
    `learner` holds the options of the shared learner (`maze_cli.learner.Learner`: precision,
    compile, compile_mode, the budget its schedules anneal over) that an algorithm passes on to its
    learner unchanged.
    """

    env_factory: EnvSource
    observation_space: gym.Space
    action_space: gym.Space
    network: dict[str, object]
    make_actors: Callable[..., "DistributedActors"]
    make_replay_buffer: Callable[..., "ReplayBuffer"]
    device: str
    seed: int
    load_policy: Callable[[str, str], "Policy"]
    action_mask_key: str | None = None  # the observation key of the action mask (`maze_cli.envs.action_mask`), if any
    learner: LearnerOptions = field(default_factory=LearnerOptions)


@dataclass
class Run:
    """What the trainer drives: the algorithm's loop, the actors or workers to start and stop, the
    learner (for checkpoints) and the blueprint of the policy the actors act with (plain data: how
    to rebuild it from a checkpoint)."""

    loop: "Loop"
    runner: "Runner"
    learner: "Learner"
    blueprint: dict[str, object]
    epoch_length: int = 20  # iterations per epoch: set by build_run from the config or the algorithm
    # the algorithm's keys left null in the config and chosen by what the env is (e.g. normalize_obs: true for
    # Box actions): printed in the run's first lines and written into config.yaml, so the run says what it ran
    chosen: dict[str, object] = field(default_factory=dict)


class Algorithm(abc.ABC):
    """The interface every algorithm class implements (besides being its own config dataclass)."""

    envs_per_actor: ClassVar[int] = 1  # what `runner.envs_per_actor: null` becomes
    network_defaults: ClassVar[dict[str, object]] = {}  # what `policy.<key>: null` becomes
    # what `epoch_length: null` becomes: iterations per epoch. An epoch is a row of stats and, with
    # evaluation on, the moment the target is judged, so it should last about a second, not more.
    epoch_length: ClassVar[int] = 20
    # true where the actors wait while the learner learns (on-policy data: PPO), so that `torch_threads: null`
    # gives the learner every core instead of one
    actors_wait_for_learner: ClassVar[bool] = False

    @abc.abstractmethod
    def build(self, parts: Components) -> Run:
        """Make the policy, learner, actors (or workers) and loop of a run."""
