"""`export-policy checkpoint=<path> format=onnx|torchscript out=<file>`: a trained policy as a file that runs
without maze_cli (docs/deploying.md). Arguments are `key=value` pairs, checked like `rollout`'s."""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, List, Optional

from omegaconf import MISSING

from maze_cli.cli import parse_key_values, quiet_on_closed_pipe, run_command
from maze_cli.config.fields import NonNegativeInt, OneOf, PositiveInt, key


@dataclass
class ExportConfig:
    checkpoint: str = key(MISSING, "a checkpoints/last.pt or best.pt of a run")
    format: Annotated[str, OneOf("onnx", "torchscript")] = key(
        "onnx",
        "onnx (onnxruntime, any language) or torchscript (C++ libtorch)")
    out: Optional[str] = key(None, "the file to write; default: policy.onnx or policy.pt beside the checkpoint")
    observations: PositiveInt = key(1000, "observations of the env the model is checked on against the trained policy")
    seed: NonNegativeInt = key(0, "derives the env seeds of the check's episodes")
    group: Optional[str] = key(None, "a policy group's model (env.policy_groups: one model per group)")
    allow: List[str] = field(default_factory=list)  # classes (import paths) the checkpoint may build besides maze_cli's own
    trust_checkpoint: bool = key(False, "the checkpoint may name any class and hold pickled objects: runs code from it")


HELP = """export-policy: write a trained policy as an ONNX or TorchScript file, checked against the policy.

Usage:
  export-policy checkpoint=<run dir>/checkpoints/best.pt [key=value ...]

Keys:
  checkpoint=<path>        (required) a checkpoints/last.pt or best.pt of a run
  format=onnx              onnx (needs pip install 'maze_cli[export]') or torchscript (for C++ libtorch)
  out=<file>               default: policy.onnx (or policy.pt) beside the checkpoint
  observations=1000        env observations the model is checked on (recurrent policies: whole episodes)
  seed=0                   derives the env seeds of the check's episodes
  group=<name>             under env.policy_groups: the model of this group (one model per group)
  allow=[my_pkg.MyNet]     classes of your own the checkpoint may build (policy network, env, env wrapper)
  trust_checkpoint=false   true: the file may hold pickled objects and name any class (runs code from it)

The model takes the env's raw observations (inputs obs or obs.<key>, batch first, any batch size; state
for a recurrent policy) and gives the greedy action in the env's space (output action) and the policy's
outputs (logits, value, ...). It is written only if every output agrees with the trained policy within
1e-5 (of a value above 1: relatively) and every discrete action is the same. The contract: docs/deploying.md."""


def _parse(argv: list[str]) -> ExportConfig:
    return parse_key_values(argv, ExportConfig, "export-policy", HELP, "checkpoint=outputs/<run>/checkpoints/best.pt format=onnx")


def run_export(cfg: ExportConfig) -> None:
    from maze_cli.export.exporter import export_checkpoint

    checkpoint = Path(cfg.checkpoint)
    out = Path(cfg.out) if cfg.out else checkpoint.with_name("policy.onnx" if cfg.format == "onnx" else "policy.pt")
    exported = export_checkpoint(checkpoint, cfg.format, out, cfg.observations, cfg.seed, cfg.allow, cfg.trust_checkpoint, cfg.group)
    worst = ", ".join(f"{name} {value:.2g}" for name, value in exported.parity.max_difference.items())
    print(f"wrote {exported.path} ({cfg.format}, {exported.size / 1024:.1f} KiB); checked against the trained policy on "
          f"{exported.parity.observations} observations, max absolute difference: {worst}")


@quiet_on_closed_pipe
def main() -> None:
    """Console script `export-policy`."""
    run_command("export-policy", lambda: run_export(_parse(sys.argv[1:])))


if __name__ == "__main__":
    main()
