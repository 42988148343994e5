"""`train`: the command line as Hydra takes it, the composed config validated and handed to the run's
session (maze_cli/cli/session.py), and every way a run ends mapped to an exit code.

Errors in the user's input end in one line on stderr and exit code 2, never a traceback
(set HYDRA_FULL_ERROR=1 for the full one); a failed run exits with 1, Ctrl-C with 130, SIGTERM with 143.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import time
from pathlib import Path

import hydra
from hydra.core.global_hydra import GlobalHydra
from hydra.core.hydra_config import HydraConfig
from hydra.errors import ConfigCompositionException
from hydra.types import RunMode
from omegaconf import DictConfig

from maze_cli.cli import leave_quickly, resume
from maze_cli.cli.errors import explain, exit_code
from maze_cli.cli.help_page import register_help_resolver
from maze_cli.cli.paths import RUN_DIR_FIX, config_dir
from maze_cli.cli.sweep import objective
from maze_cli.cli.settings import NoEnvError, register_configs, validate
from maze_cli.disk import STOPPED_BY_FULL_DISK, DiskFull, is_unwritable, unwritable_message
from maze_cli.errors import ConfigError
from maze_cli.interrupts import Terminated

log = logging.getLogger("maze_cli")
register_configs()  # the schemas the packaged YAML files extend (also in sweep workers, which import this)
register_help_resolver()


def _env_options() -> list[str]:
    """The env configs a user may name with `+env=`, for the message of a run that names none."""
    try:
        return sorted(GlobalHydra.instance().config_loader().get_group_options("env"))
    except Exception:  # outside a Hydra run: the packaged ones
        return sorted(path.stem for path in (config_dir() / "env").glob("*.yaml"))


def run_train(cfg: DictConfig) -> dict:
    """The task: everything after composition. Returns a summary of the run, with its `objective`
    (what a sweeper optimizes: `sweep.objective`)."""
    started = time.perf_counter()
    if cfg.get("resume"):
        cfg = resume.resumed_config(cfg, HydraConfig.get().overrides.task)
    settings = validate(cfg, _env_options())
    resumed_from = None  # last.pt of the run to resume, read once
    if settings.train.resume and settings.train.pbt.population < 2:  # (a population's members resume themselves)
        resumed_from = resume.read_last_checkpoint(settings.train)
        finished = resume.finished(resumed_from, Path(settings.train.resume), settings.train)
        if finished is not None:
            print(finished)  # not logged: train.log stays as it was
            return {"stop_reason": "finished", "env_steps": None, "time_s": 0.0,
                    "objective": objective(Path(settings.train.resume), settings.train)}
    run_dir = Path(HydraConfig.get().runtime.output_dir)
    if not settings.train.resume:
        resume.refuse_a_used_run_dir(run_dir)
    if settings.train.pbt.population >= 2:
        from maze_cli.cli.population import run_population

        return run_population(cfg, settings, run_dir, started)
    from maze_cli.cli.session import run_session  # the run's modules, loaded once the config is valid

    return run_session(cfg, settings, run_dir, resumed_from, started)


_FULL_ERROR = os.environ.get("HYDRA_FULL_ERROR") == "1"
_task_started = False  # whether Hydra called the task (its errors before are its own writes: the run dir, train.log)


def _exit_on_user_error(err: Exception) -> None:
    """Print a known error as one line and exit; return (to re-raise) for anything else."""
    if isinstance(err, ConfigCompositionException) and "${env}" in str(err):  # train.yaml's tuning entry names the env
        err = NoEnvError(_env_options())
    message = None if _FULL_ERROR else explain(err, sys.argv[1:])
    unwritable = None if _task_started else is_unwritable(err)  # Hydra's own writes, before the task: the run dir
    if unwritable is not None and not _FULL_ERROR:
        message = unwritable_message("the run dir", unwritable, RUN_DIR_FIX)
        err = ConfigError(message)
    if message is not None:
        print(f"train: error: {message}", file=sys.stderr)
        sys.exit(exit_code(err))


def _discard_unused_run_dir() -> None:
    """Remove the run dir Hydra made for a run that never started, if it holds only Hydra's own files."""
    run_dir = Path(HydraConfig.get().runtime.output_dir)
    hydra_files = {"config.yaml", "hydra.yaml", "overrides.yaml"}
    log_file = run_dir / "train.log"
    try:
        if set(os.listdir(run_dir)) - {".hydra", "train.log"} or set(os.listdir(run_dir / ".hydra")) - hydra_files:
            return
        if log_file.exists() and log_file.stat().st_size > 0:
            return
        for name in hydra_files:
            (run_dir / ".hydra" / name).unlink(missing_ok=True)
        (run_dir / ".hydra").rmdir()
        log_file.unlink(missing_ok=True)
        run_dir.rmdir()
        # and the dirs above it that it alone made (outputs/<date>/), inside the dir the command ran in
        cwd = Path(HydraConfig.get().runtime.cwd).resolve()
        for parent in run_dir.resolve().parents:
            if parent == cwd or cwd not in parent.parents or any(parent.iterdir()):
                break
            parent.rmdir()
    except OSError:
        pass


@hydra.main(version_base="1.3", config_path=str(config_dir()), config_name="train")
def _hydra_train(cfg: DictConfig) -> float:
    """The run's objective as a float (`sweep.objective`), which Hydra's sweepers (Optuna's) optimize."""
    # Errors are reported here, inside the job, so Hydra adds no lines of its own to the message.
    global _task_started
    _task_started = True
    try:
        return run_train(cfg)["objective"]
    except ConfigError as err:
        _discard_unused_run_dir()
        _exit_on_user_error(err)
        raise
    except DiskFull as err:
        if HydraConfig.get().mode != RunMode.MULTIRUN:
            _exit_on_user_error(err)
            raise
        # A sweep goes on with its other jobs (each has a dir of its own, maybe on another disk); the
        # summary leaves this one out, and the command exits non-zero at the end.
        print(f"train: error: job {HydraConfig.get().job.num}: {err}", file=sys.stderr)
        STOPPED_BY_FULL_DISK.add(Path(HydraConfig.get().runtime.output_dir).name)
        return float("nan")  # no objective: a sweeper records the trial as failed
    except Exception as err:
        if explain(err, sys.argv[1:]) is not None:  # bad input found inside the job (an interpolation): nothing ran
            _discard_unused_run_dir()
        _exit_on_user_error(err)
        raise


def _rewritten_argv(args: list[str]) -> list[str]:
    """The command line as Hydra gets it: `init_from=<path>` spelt out, `env.<key>=<value>` set whether
    or not the env config has the key, and for `resume=` (or `--help`) the run dir and the tuning entry
    that the saved config (or the help) needs."""
    resume_dir = next((a.split("=", 1)[1] for a in args if a.startswith("resume=")), None)
    # `init_from=<path>` is short for init_from.path=<path>, so that init_from.optimizer=... may come beside it.
    args = [f"init_from.path={a.split('=', 1)[1]}" if a.startswith("init_from=") else a for a in args]
    if any(a.startswith(("+env=", "env=")) for a in args):  # without an env, an env key is "no env chosen"
        args = [_open_key_set(a) for a in args]
    if resume_dir and not any(a.startswith("hydra.run.dir=") for a in args):
        # A resumed run continues in its own dir; Hydra's record of the first command stays as it was.
        args += [f"hydra.run.dir={resume_dir}", "hydra.output_subdir=null"]
    asks_help = any(a in ("--help", "-h") for a in args)
    if (resume_dir or asks_help) and not any(a.startswith(("tuning=", "+env=", "env=")) for a in args):
        # train.yaml picks tuning/<env>_<algorithm>; a resumed run names no env (its saved config holds every
        # value), nor need `train --help`.
        args.append("tuning=none")
    return args


def _refuse_a_named_run_dir_in_use(args: list[str]) -> None:
    """`hydra.run.dir=<dir>` of another run, without resume=: refused before Hydra writes its record of the
    command into it (the task refuses any other run dir in use, once Hydra has chosen it)."""
    named = next((a.split("=", 1)[1] for a in args if a.startswith("hydra.run.dir=")), None)
    if named and not any(a.startswith("resume=") for a in args) and not any(a in ("-m", "--multirun") for a in args):
        resume.refuse_a_used_run_dir(Path(named))


def _open_key_set(arg: str) -> str:
    """`env.<key>=<value>` (or `+env.<key>=...`) as Hydra's `++env.<key>=<value>`: an env config is the user's (their own YAML,
    any `_target_`'s arguments, any env's kwargs), so no env config can list every key that may be set on
    it; one rule holds for all of them, packaged or not, with or without a default (docs/envs.md).
    Unknown keys are still refused, by the env's own check (maze_cli.envs.factory). `pbt.mutations={...}`
    likewise: a mapping whose keys are the user's to choose (checked by maze_cli.pbt.mutations)."""
    key = arg.split("=", 1)[0].removeprefix("+")
    forced = (key.startswith("env.") and key[4:]) or key == "pbt.mutations"
    return f"++{arg.removeprefix('+')}" if "=" in arg and forced else arg


def main() -> None:
    """Console script `train`."""
    leave_quickly()
    os.environ["HYDRA_FULL_ERROR"] = "1"  # composition errors reach us; we print them for humans
    # A job a script starts in the background inherits SIGINT as ignored: `kill -INT` must still stop it gracefully.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    sys.argv[1:] = _rewritten_argv(sys.argv[1:])
    try:
        _refuse_a_named_run_dir_in_use(sys.argv[1:])
        _hydra_train()
        if STOPPED_BY_FULL_DISK:  # a sweep some of whose jobs a full disk stopped
            sys.exit(1)
    except KeyboardInterrupt as interrupt:
        sys.exit(143 if isinstance(interrupt, Terminated) else 130)
    except Exception as err:
        _exit_on_user_error(err)
        raise


if __name__ == "__main__":
    main()
