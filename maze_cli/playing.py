"""What `rollout` and `export-policy` play: a checkpoint's policy, or a model `export-policy` wrote, with the env
of its run. A file names classes and callables, so both are loaded as data under one allow-list (the policy's
blueprint, the env's maker and wrappers): loading runs no code from the file unless it is trusted."""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

from maze_cli.errors import CheckpointError


def load_played(path: Path, allow: Sequence[str], trust: bool):
    """(payload, policy, env factory) of a checkpoint to play, as `rollout` and `export-policy` load it: the
    allow-list guards both the policy's blueprint and the callables its env config names (loading runs no
    code from the file), and the policy must fit the env's spaces."""
    from maze_cli.checkpoint import load_checkpoint, policy_from_payload

    where = f"checkpoint={path}"
    payload = load_checkpoint(path, trust, where)
    env_config = (payload.get("config") or {}).get("env")
    if not isinstance(env_config, dict):
        raise CheckpointError(f"{where}: the checkpoint names no env (config.env)")
    check_env_callables(env_config, allow, trust, where, "the checkpoint")
    policy = policy_from_payload(payload, list(allow), trust, where)
    return payload, policy, env_for_policy(policy, env_config, payload["config"].get("policy"), where)


def check_env_callables(env_config: dict, allow: Sequence[str], trust: bool, where: str, named_by: str) -> None:
    """Refuse an env config (from a file) naming a callable outside the allow-list: building the env would run it."""
    from maze_cli.policies.blueprint import refused_env_callables

    refused = refused_env_callables(env_config, allow, trust)
    if refused:
        what = "its env is built by" if refused[0] == env_config.get("_target_") else "its env is wrapped by"
        raise CheckpointError(f"{where}: {what} '{refused[0]}', a callable {named_by} names; refused. "
                              f"Allow it by name with allow=[{','.join(refused)}], or trust_checkpoint=true (runs code from the file)")


def env_for_policy(policy, env_config: dict, policy_config: dict | None, where: str):
    """The env factory of the run, checked to have the spaces the policy acts in."""
    from maze_cli.envs.factory import EnvFactory
    from maze_cli.policies.blueprint import check_spaces

    env_factory = EnvFactory.for_policy(env_config, policy_config).resolved()
    observation_space, action_space = env_factory.check()
    check_spaces(policy, observation_space, action_space, where)
    return env_factory
