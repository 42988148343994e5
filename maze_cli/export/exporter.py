"""`export-policy`'s work: a checkpoint's policy as a file, written only once checked against the policy.

Loading is `rollout`'s (`maze_cli.playing.load_played`): data, an allow-list, no code from the file.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Sequence

import torch
from torch import nn

from maze_cli.envs.action_mask import FROM_INFO
from maze_cli.errors import ConfigError, MazeCliError
from maze_cli.export.contract import metadata
from maze_cli.export.formats import load_model, write_model
from maze_cli.export.graph import PolicyGraph
from maze_cli.export.heads import head_for
from maze_cli.export.parity import N_ENVS, Difference, MultiAgentEnvs, Parity, SingleAgentEnvs, check_parity


class ExportMismatch(MazeCliError):
    """The written model does not compute what the trained policy does: nothing is kept."""


@dataclass
class Exported:
    path: Path
    size: int
    parity: Parity


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def algorithm_name(config: dict) -> str:
    """`impala`, `ppo`, ... from the run's `algorithm._target_`."""
    target = str((config.get("algorithm") or {}).get("_target_", "unknown"))
    return target.rsplit(".", 1)[-1].lower()


def export_checkpoint(checkpoint: Path, fmt: str, out: Path, n_observations: int, seed: int = 0, allow: Sequence[str] = (),
                      trust: bool = False, group: str | None = None) -> Exported:
    """Write the policy of `checkpoint` (of a policy group: `group`'s) to `out` in `fmt` and check it on
    `n_observations` observations of its env (episodes seeded from `seed`); a model that differs is removed and
    an `ExportMismatch` names the output."""
    from maze_cli.playing import load_played
    from maze_cli.envs.source import as_env_source
    from maze_cli.seeding import derive_seeds

    payload, policy, env_factory = load_played(checkpoint, list(allow), trust)
    where = f"checkpoint={checkpoint}"
    exported = _chosen(policy, group, where)
    mask_from_info = env_factory.config.get("action_mask_key") == FROM_INFO
    graph = PolicyGraph(head_for(exported, where), mask_from_info).eval()
    source = as_env_source(env_factory)
    envs = (MultiAgentEnvs(source, policy.eval(), seed, group) if source.agents
            else SingleAgentEnvs(source, derive_seeds(seed, "export_env", n_observations + N_ENVS)))
    config = payload["config"]
    meta = metadata(exported.observation_space, exported.action_space, algorithm_name(config), sha256(checkpoint), graph.inputs,
                    graph.outputs, graph.state_size, config["env"], config.get("policy"), group, mask_from_info)
    created = _missing_folders(out.parent)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.tmp-{os.getpid()}")
    try:
        write_model(graph, fmt, tmp, meta)
        run, _ = load_model(tmp, fmt)
        with one_thread():
            result = check_parity(run, graph, envs, n_observations)
        if isinstance(result, Difference):
            raise ExportMismatch(f"format={fmt}: the exported model's {result}; nothing written")
        os.replace(tmp, out)
    except BaseException:
        tmp.unlink(missing_ok=True)
        for folder in created:  # innermost first: a failed export leaves no trace
            folder.rmdir()
        raise
    return Exported(out, out.stat().st_size, result)


@contextlib.contextmanager
def one_thread() -> Iterator[None]:
    """torch on one thread, as actors act: the check's batches are a few envs, where more threads only wait
    for one another (and spin, on a busy machine)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def _missing_folders(folder: Path) -> list[Path]:
    """`folder` and its ancestors that do not exist yet, innermost first."""
    missing = []
    while not folder.exists():
        missing.append(folder)
        folder = folder.parent
    return missing


def _chosen(policy: nn.Module, group: str | None, where: str) -> nn.Module:
    """The policy to export: `policy` itself, or the member of policy group `group` (one model per group)."""
    from maze_cli.policies.groups import PolicyGroups

    if isinstance(policy, PolicyGroups):
        if group not in policy.members:
            given = "" if group is None else f"group={group}: no such policy group; "
            raise ConfigError(f"{where}: {given}its policy has a model per group: export each with group=<name> "
                              f"(its groups: {', '.join(policy.members)})")
        return policy.members[group]
    if group is not None:
        raise ConfigError(f"group={group}: the checkpoint's policy has no policy groups (env.policy_groups); leave group out")
    return policy
