"""Checkpoints, written atomically: a temp file beside the target, then a rename."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

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
