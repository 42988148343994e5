"""Run the real console scripts in a subprocess, tagged so that leftover processes can be found."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TRAIN = Path(sys.executable).with_name("train")
# SAC in a test of something other than how it learns: small networks and a tenth of an update per env step
SAC_CHEAP = ["algorithm.initial_buffer_size=200", "algorithm.batch_size=32", "policy.hidden_sizes=[16,16]", "algorithm.replay_ratio=0.1"]


@dataclass
class Result:
    returncode: int
    stdout: str
    stderr: str
    tag: str


def run_train(*overrides: str, run_dir: Path | None = None, timeout: float = 300, env: dict | None = None) -> Result:
    """`train <overrides>`, writing into `run_dir`; returns exit code, output and the process tag."""
    tag = uuid.uuid4().hex
    full_env = {**os.environ, "MAZE_TEST_TAG": tag, "PYTHONPATH": str(REPO), **(env or {})}
    full_env.pop("HYDRA_FULL_ERROR", None)
    args = [str(TRAIN), *overrides]
    if run_dir is not None:
        args.append(f"hydra.run.dir={run_dir}")
    proc = subprocess.run(args, capture_output=True, text=True, timeout=timeout, env=full_env, cwd=run_dir.parent if run_dir else None, stdin=subprocess.DEVNULL)
    return Result(proc.returncode, proc.stdout, proc.stderr, tag)


def restart_budget(fault: str, seconds: float) -> list[str]:
    """Budget overrides for a run that must finish after an actor restart. A hang is only noticed
    after rollout_timeout_s while the healthy actors go on, so that run gets `seconds` of time,
    whatever the machine's speed; other faults get a step budget."""
    return ["max_env_steps=100000000", f"max_time_s={seconds}"] if fault == "hang" else ["max_env_steps=30000"]


def stopped_by(budget: list[str]) -> str:
    """The log line's start that says the run ended by the last key of `budget`."""
    return f"stopped: {budget[-1].split('=')[0]} after"


def fault_env(tmp_path: Path, fault: str, **env_options) -> list[str]:
    """Overrides that train on `tests.envs.FaultOnceEnv` with `fault` injected once in the run
    (the marker file under `tmp_path` records that it happened)."""
    config_dir = tmp_path / "configs"
    (config_dir / "env").mkdir(parents=True, exist_ok=True)
    after = 30 if fault == "raise_reset" else 300
    options = "".join(f"{k}: {v}\n" for k, v in env_options.items())
    (config_dir / "env" / "faulty.yaml").write_text(
        f"_target_: tests.envs.FaultOnceEnv\nmarker: {tmp_path / 'fault'}\nfault: {fault}\nafter: {after}\nlength: 5\n{options}")
    # 8 envs an actor: each env instance reaches `after` steps early in a short run.
    return ["--config-dir", str(config_dir), "+env=faulty", "eval.interval=0", "runner.envs_per_actor=8"]
