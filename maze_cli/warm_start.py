"""Warm start (`init_from=`): a new run whose policy starts from a checkpoint's weights.

Unlike `resume=` (the same run continued in place: counters, RNG states, optimizer and all), a
warm start is a new run in a new run dir with fresh counters; it takes the checkpoint's policy
weights only, plus, if asked, the learner's optimizer state (`init_from.optimizer`) and the
observation and reward statistics (`init_from.normalizer`). Everything is checked before any actor
starts: the file is read as plain data (maze_cli.checkpoint), its policy is rebuilt from the
allow-list, and its spaces and every weight's shape must match this run's.
"""

from __future__ import annotations

from typing import Any, Iterable

from torch import nn

from maze_cli.checkpoint import load_checkpoint, policy_from_payload
from maze_cli.errors import ConfigError, first_line
from maze_cli.learner import Learner
from maze_cli.policies.blueprint import check_spaces

NORMALIZER_PREFIX = "obs_normalizer."  # the observation statistics inside an actor-critic's state


def warm_start(learner: Learner, path: str, optimizer: bool = False, normalizer: bool = False,
               trusted: Iterable[str] = (), trust: bool = False) -> dict[str, Any]:
    """Load the checkpoint at `path` into `learner` (its policy, and what was asked); return the
    checkpoint's payload. A file that cannot be used is one CheckpointError; a mismatch one ConfigError
    naming both sides."""
    where = f"init_from={path}"
    payload = load_checkpoint(path, trust, where)
    theirs = policy_from_payload(payload, trusted, trust, where)
    ours: nn.Module = learner.policy
    check_spaces(theirs, ours.observation_space, ours.action_space, where)
    ours.load_state_dict(_policy_weights(theirs.state_dict(), ours.state_dict(), normalizer, where))
    learner_state = payload["learner"]
    if optimizer:
        try:
            learner.load_training_state(learner_state)
        except (KeyError, ValueError, RuntimeError) as err:
            written_by = (payload.get("config") or {}).get("algorithm", {}).get("_target_", "another algorithm")
            raise ConfigError(f"{where}: init_from.optimizer=true, but the checkpoint's optimizer state (written by "
                              f"{written_by}) does not fit this run's learner ({first_line(err) or type(err).__name__}); "
                              f"leave init_from.optimizer=false to take the policy only") from None
    if normalizer:
        learner.load_normalizer_state(learner_state)
    return payload


def _policy_weights(theirs: dict[str, Any], ours: dict[str, Any], normalizer: bool, where: str) -> dict[str, Any]:
    """The checkpoint's weights for this run's policy: every key and shape must match; the
    observation statistics are this run's fresh ones unless `normalizer`."""
    if normalizer and any(k.startswith(NORMALIZER_PREFIX) for k in ours) and not any(k.startswith(NORMALIZER_PREFIX) for k in theirs):
        raise ConfigError(f"{where}: init_from.normalizer=true, but the checkpoint was trained without observation "
                          f"statistics (algorithm.normalize_obs and normalize_images off); leave init_from.normalizer=false")
    if not normalizer:
        theirs = {k: v for k, v in theirs.items() if not k.startswith(NORMALIZER_PREFIX)}
        theirs |= {k: v for k, v in ours.items() if k.startswith(NORMALIZER_PREFIX)}
    for key in sorted(theirs.keys() | ours.keys()):
        if key not in ours or key not in theirs:
            side = "the checkpoint's" if key in theirs else "this run's"
            raise ConfigError(f"{where}: the checkpoint's network does not fit this run's: {key} is only in {side} "
                              f"(policy.*, algorithm.shared_network, normalize_obs and normalize_images must be as in the checkpoint's run)")
        if tuple(theirs[key].shape) != tuple(ours[key].shape):
            raise ConfigError(f"{where}: the checkpoint's network does not fit this run's: {key} has shape "
                              f"{tuple(theirs[key].shape)} there and {tuple(ours[key].shape)} here "
                              f"(policy.* must be as in the checkpoint's run)")
    return theirs

