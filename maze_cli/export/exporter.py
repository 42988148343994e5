"""`export-policy`'s work: a checkpoint's policy as a file, written only once checked against the policy.

Loading is `rollout`'s (`maze_cli.cli.rollout.load_played`): data, an allow-list, no code from the file.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from maze_cli.errors import ConfigError, MazeCliError
from maze_cli.export.contract import metadata
from maze_cli.export.formats import load_model, write_model
from maze_cli.export.graph import PolicyGraph
from maze_cli.export.heads import head_for
from maze_cli.export.parity import Difference, Parity, check_parity


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


def export_checkpoint(checkpoint: Path, fmt: str, out: Path, n_observations: int, seeds: Sequence[int],
                      allow: Sequence[str] = (), trust: bool = False) -> Exported:
    """Write the policy of `checkpoint` to `out` in `fmt` and check it on `n_observations` observations of its
    env (`seeds` for the episodes); a model that differs is removed and an `ExportMismatch` names the output."""
    from maze_cli.cli.rollout import load_played
    from maze_cli.envs.source import as_env_source

    payload, policy, env_factory = load_played(checkpoint, list(allow), trust)
    source = as_env_source(env_factory)
    if source.agents:
        raise ConfigError(f"checkpoint={checkpoint}: its env is a multi-agent one ({source.describe()}), which export-policy "
                          f"cannot check against the policy yet")
    graph = PolicyGraph(head_for(policy, f"checkpoint={checkpoint}")).eval()
    config = payload["config"]
    meta = metadata(policy.observation_space, policy.action_space, algorithm_name(config), sha256(checkpoint), graph.inputs,
                    graph.outputs, graph.state_size, config["env"], config.get("policy"))
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.tmp-{os.getpid()}")
    try:
        write_model(graph, fmt, tmp, meta)
        run, _ = load_model(tmp, fmt)
        result = check_parity(run, graph, source, n_observations, list(seeds))
        if isinstance(result, Difference):
            raise ExportMismatch(f"format={fmt}: the exported model's {result}; nothing written")
        os.replace(tmp, out)
    finally:
        tmp.unlink(missing_ok=True)
    return Exported(out, out.stat().st_size, result)
