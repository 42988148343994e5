"""`resume=<run dir>`: a stopped run goes on from its last checkpoint, under the config it was started with.

Only the budget and the run's housekeeping may change (`RESUMABLE_KEYS`); a run that already reached
its stop condition is left as it is, with one line saying which key would extend it.
"""

from __future__ import annotations

import logging
import math
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable

from omegaconf import DictConfig, OmegaConf

from maze_cli.config.schema import TrainConfig
from maze_cli.errors import ConfigError

if TYPE_CHECKING:  # the session's types: `train` imports their modules once the config is valid
    from maze_cli.checkpoint import Checkpointer
    from maze_cli.stats.writers import JsonlWriter, TensorBoardWriter
    from maze_cli.training import Trainer

log = logging.getLogger("maze_cli")

CHECKPOINTS = ("last.pt", "previous.pt", "best.pt")  # what a resume reads, the first intact one of the newest
CORRUPT = "last.corrupt.pt"  # where a broken last.pt goes when a resume falls back from it
# Keys a resumed run may change; everything else comes from the run's saved config.
RESUMABLE_KEYS = {"max_env_steps", "max_time_s", "target_return", "target_window", "epoch_length", "eval", "checkpoint",
                  "device", "torch_threads", "learner", "resume", "trust_checkpoint", "callbacks", "sweep"}


def refuse_a_used_run_dir(run_dir: Path) -> None:
    """A new run never writes into the dir of another: its rows would follow the other's in stats.jsonl,
    its checkpoints replace the other's. `resume=<run dir>` is how a run goes on in its own dir."""
    held = [name for name in ("stats.jsonl", "pbt.jsonl") if (run_dir / name).is_file() and (run_dir / name).stat().st_size]
    held += [f"checkpoints/{name}" for name in CHECKPOINTS if (run_dir / "checkpoints" / name).is_file()]
    if held:
        raise ConfigError(f"the run dir {run_dir} holds a run already ({', '.join(held)}): resume={run_dir} goes on with "
                          f"it; for a new run, choose another hydra.run.dir (or remove that dir)")


def resumed_config(cfg: DictConfig, overrides: Iterable[str]) -> DictConfig:
    """The saved config of the run in `cfg.resume`, with this command's budget `overrides` on top."""
    run_dir = Path(cfg.resume)
    population = (run_dir / "member_0").is_dir()  # (pbt.population: each member's checkpoints are in its own dir)
    if population and not (run_dir / "config.yaml").is_file():
        raise ConfigError(f"resume={cfg.resume}: a population without its config.yaml (written by an older maze_cli), "
                          f"which cannot be resumed whole; resume one member as an ordinary run: resume={run_dir / 'member_0'}")
    has_checkpoint = population or any((run_dir / "checkpoints" / name).is_file() for name in CHECKPOINTS)
    if not (run_dir / "config.yaml").is_file() or not has_checkpoint:
        raise ConfigError(f"resume={cfg.resume}: not a run dir with config.yaml and checkpoints/last.pt")
    saved = OmegaConf.load(run_dir / "config.yaml")
    changed = {o.split("=", 1)[0].lstrip("+~").split(".")[0] for o in overrides} - {"tuning"}
    bad = sorted(changed - RESUMABLE_KEYS)
    if bad:
        raise ConfigError(f"{bad[0]}: cannot change when resuming; only {', '.join(sorted(RESUMABLE_KEYS - {'resume'}))} may change")
    OmegaConf.set_struct(saved, False)
    for key in changed:
        saved[key] = cfg[key]
    return saved


def read_last_checkpoint(t: TrainConfig) -> dict[str, Any]:
    """The run's last.pt, read once, before anything starts: whether the run is finished is judged
    on it, and the trainer restores it. A last.pt that is missing, cut short or garbled (a crash or a
    full disk while it was written) gives way to the newest intact one of previous.pt (the last.pt
    before it) and best.pt, said in one line; with none intact, the run is refused as before."""
    from maze_cli.checkpoint import load_checkpoint  # the session's module: needed before it only with resume=
    from maze_cli.errors import CorruptCheckpoint

    checkpoints, where = Path(t.resume) / "checkpoints", f"resume={t.resume}: checkpoints/"
    try:
        if not (checkpoints / "last.pt").is_file():  # (a crash between the renames of a save)
            raise CorruptCheckpoint(f"{where}last.pt is missing")
        return load_checkpoint(checkpoints / "last.pt", t.trust_checkpoint, where=f"{where}last.pt")
    except CorruptCheckpoint as err:
        broken = err
    intact = []
    for name in CHECKPOINTS[1:]:
        if not (checkpoints / name).is_file():
            continue
        try:
            intact.append((name, load_checkpoint(checkpoints / name, t.trust_checkpoint, where=f"{where}{name}")))
        except CorruptCheckpoint:
            continue
    if not intact:
        raise CorruptCheckpoint(f"{broken}, and no intact {' or '.join(CHECKPOINTS[1:])} beside it to resume from")
    name, saved = max(intact, key=lambda named: named[1]["trainer"]["env_steps"])
    counters = saved["trainer"]
    aside = ""
    if (checkpoints / "last.pt").is_file():  # kept for a look, where the next save would turn it into previous.pt
        (checkpoints / "last.pt").replace(checkpoints / CORRUPT)
        aside = f" (the broken file is kept as checkpoints/{CORRUPT})"
    log.warning(f"{broken}; resuming from checkpoints/{name} instead, the newest intact checkpoint (epoch {counters['epoch']}, "
                f"{counters['env_steps']:,} env steps){aside}")
    return saved


def finished(saved: dict[str, Any], run_dir: Path, t: TrainConfig) -> str | None:
    """For a run whose last.pt (`saved`) already reached its stop condition (under this command's
    budget): the message saying so and which key would extend it; None if it has more to do."""
    extend = extension(saved, t)
    if extend is None:
        return None
    trainer = saved.get("trainer") or {}
    return (f"resume={run_dir}: the run is finished (stopped by {saved.get('stop_reason')} after {trainer.get('env_steps', 0):,} "
            f"env steps, epoch {trainer.get('epoch', 0)}); nothing was changed. To train on, raise {extend}")


def extension(saved: dict[str, Any], t: TrainConfig) -> str | None:
    """The key that would extend a run whose last.pt (`saved`) reached its stop condition under this
    command's budget, with an example; None if the run has more to do."""
    reason, trainer = saved.get("stop_reason"), saved.get("trainer") or {}
    steps, time_s = trainer.get("env_steps", 0), trainer.get("time_s", 0.0)
    window = trainer.get("window") or []
    reached_target = t.target_return is not None and (
        (trainer.get("best_eval") or -math.inf) >= t.target_return if t.eval.interval > 0
        else len(window) >= t.target_window and sum(window[-t.target_window:]) / t.target_window >= t.target_return)
    return {
        "max_env_steps": f"max_env_steps (e.g. max_env_steps={2 * steps})" if steps >= t.max_env_steps else None,
        "max_time_s": f"max_time_s (e.g. max_time_s={2 * time_s:.0f})" if t.max_time_s is not None and time_s >= t.max_time_s else None,
        "target_return": "target_return (or target_return=null to run for the budget)" if reached_target else None,
    }.get(reason)


def restore(checkpointer: Checkpointer, saved: dict[str, Any], trainer: Trainer, jsonl: JsonlWriter,
            tensorboard: TensorBoardWriter, run_dir: Path) -> None:
    """The learner, trainer and counters from last.pt (`saved`); the rows stats.jsonl and
    TensorBoard got after it are rolled back, as those epochs are trained again."""
    checkpointer.restore(trainer, saved)
    dropped = jsonl.rewind(trainer.epoch, trainer.env_steps)
    tensorboard.rewind(trainer.epoch, trainer.env_steps)
    log.info(f"resumed {run_dir} at epoch {trainer.epoch}, {trainer.env_steps:,} env steps"
             + (f" (its last checkpoint; the {dropped} epoch rows written after it are trained again)" if dropped else ""))


def restore_actors(checkpointer: Checkpointer, saved: dict[str, Any]) -> None:
    """A reproducible run's resume: the actors (every learner's) go on from the state saved with last.pt,
    so that the run is the one that never stopped; where they cannot, one line says from where it no longer is."""
    why = checkpointer.restore_actors(saved)
    if why is None:
        log.info("runner.reproducible: the actors go on from their saved state; the run goes on as the one that never stopped")
    else:
        log.warning(f"runner.reproducible: the actors' envs start anew ({why}), so from here on the run is not the one that "
                    f"never stopped")
