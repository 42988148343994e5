"""Checkpoints, written atomically: a temp file beside the target, then a rename.

`last.pt` every `interval` epochs, at the end and on interruption; `best.pt` whenever the eval
return improves. Each holds the learner (policy, optimizers, counters), the trainer's counters,
the RNG states, the config, the policy's blueprint and, if asked, the replay buffer.
"""

from __future__ import annotations

import dataclasses
import os
import random
from pathlib import Path
from typing import Any

import numpy as np
import torch


def save_checkpoint(path: Path, payload: dict[str, Any]) -> None:
    """Write `payload` to `path` so that a reader never sees a truncated file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    torch.save(payload, tmp)
    os.replace(tmp, path)


def load_checkpoint(path: Path) -> dict[str, Any]:
    return torch.load(path, map_location="cpu", weights_only=False)


def load_policy(path: Path):
    """Rebuild the policy a checkpoint was trained with (its blueprint) and load its weights."""
    from maze_cli.cli.build import PolicyBlueprint

    payload = load_checkpoint(path)
    blueprint = PolicyBlueprint(**payload["policy_blueprint"])
    policy = blueprint.build()
    policy.load_state_dict(payload["learner"]["policy"])
    return policy


def _rng_states() -> dict[str, Any]:
    return {"torch": torch.get_rng_state(), "numpy": np.random.get_state(), "python": random.getstate()}


def _set_rng_states(states: dict[str, Any]) -> None:
    torch.set_rng_state(states["torch"])
    np.random.set_state(states["numpy"])
    random.setstate(states["python"])


class Checkpointer:
    """Writes and restores the checkpoints of one run."""

    def __init__(self, directory: Path, run, trainer, config: dict, interval: int, with_replay_buffer: bool):
        self.directory = directory
        self.run = run
        self.trainer = trainer
        self.config = config
        self.interval = interval
        self.with_replay_buffer = with_replay_buffer

    def _replay_buffer(self):
        return getattr(self.run.runner, "replay_buffer", None)

    def payload(self, reason: str) -> dict[str, Any]:
        payload = {
            "learner": self.run.learner.state_dict(),
            "trainer": self.trainer.state_dict(),
            "policy_blueprint": dataclasses.asdict(self.run.blueprint),
            "rng": _rng_states(),
            "config": self.config,
            "stop_reason": reason,
        }
        buffer = self._replay_buffer()
        if self.with_replay_buffer and buffer is not None:
            payload["replay_buffer"] = buffer.state_dict()
            payload["worker_env_steps"] = self.run.runner.env_steps
        return payload

    def save_last(self, reason: str) -> None:
        save_checkpoint(self.directory / "last.pt", self.payload(reason))

    def on_epoch_end(self, stats: dict[str, Any]) -> None:
        if "eval/return_mean" in stats and stats["eval/return_mean"] == stats["eval/best_return_mean"]:
            save_checkpoint(self.directory / "best.pt", self.payload("best"))
        if self.trainer.epoch % self.interval == 0:
            self.save_last("running")

    def restore(self) -> None:
        """Continue from `last.pt`: learner, counters, RNG states and, if saved, the replay buffer."""
        state = load_checkpoint(self.directory / "last.pt")
        self.run.learner.load_state_dict(state["learner"])
        self.trainer.load_state_dict(state["trainer"])
        _set_rng_states(state["rng"])
        buffer = self._replay_buffer()
        if buffer is not None and "replay_buffer" in state:
            buffer.load_state_dict(state["replay_buffer"])
            self.run.runner.env_steps = state["worker_env_steps"]
