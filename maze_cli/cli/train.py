"""`train`: compose the run with Hydra, validate it, build the parts, train.

Errors in the user's input end in one line on stderr and exit code 2, never a traceback
(set HYDRA_FULL_ERROR=1 for the full one).
"""

from __future__ import annotations

import contextlib
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
from omegaconf import DictConfig, OmegaConf

from maze_cli.cli import leave_quickly, resume
from maze_cli.cli.errors import explain, exit_code
from maze_cli.cli.paths import config_dir
from maze_cli.cli.sweep import objective
from maze_cli.config.schema import NoEnvError, register_configs, validate
from maze_cli.disk import STOPPED_BY_FULL_DISK, DiskFull, check_writable_dir, is_disk_full, is_unwritable, quiet_full_disk_in_log_files, unwritable_message
from maze_cli.errors import ConfigError, NonFiniteLoss, TrainingDiverged

log = logging.getLogger("maze_cli")
register_configs()  # the schemas the packaged YAML files extend (also in sweep workers, which import this)


def _group_options(group: str, default: str) -> str:
    """`${maze_options:<group>,<default>}` in the help: the group's packaged options, the default first."""
    names = sorted(p.stem for p in (config_dir() / group).glob("*.yaml"))
    return ", ".join([f"{default} (default)", *(n for n in names if n != default)])


OmegaConf.register_new_resolver("maze_options", _group_options, replace=True)


def _env_options() -> list[str]:
    try:
        return sorted(GlobalHydra.instance().config_loader().get_group_options("env"))
    except Exception:  # outside a Hydra run: the packaged ones
        return sorted(path.stem for path in (config_dir() / "env").glob("*.yaml"))


RUN_DIR_FIX = "choose a writable place with hydra.run.dir=<dir> (hydra.sweep.dir=<dir> with -m) or make it writable"

class Terminated(KeyboardInterrupt):
    """SIGTERM, handled like Ctrl-C (actors stopped, last.pt written) but exiting with 143."""


def _raise_terminated(signum, frame) -> None:
    raise Terminated()


def run_train(cfg: DictConfig) -> dict:
    """The task: everything after composition. Returns a summary of the run, with its `objective`
    (what a sweeper optimizes: `sweep.objective`)."""
    started = time.perf_counter()
    if cfg.get("resume"):
        cfg = resume.resumed_config(cfg, HydraConfig.get().overrides.task)
    settings = validate(cfg, _env_options())
    resumed_from = None  # last.pt of the run to resume, read once
    if settings.train.resume:
        resumed_from = resume.read_last_checkpoint(settings.train)
        finished = resume.finished(resumed_from, Path(settings.train.resume), settings.train)
        if finished is not None:
            print(finished)  # not logged: train.log stays as it was
            return {"stop_reason": "finished", "env_steps": None, "time_s": 0.0,
                    "objective": objective(Path(settings.train.resume), settings.train)}
    run_dir = Path(HydraConfig.get().runtime.output_dir)
    check_writable_dir(run_dir, "the run dir", RUN_DIR_FIX)
    quiet_full_disk_in_log_files()
    _warm_up_actor_processes(settings)
    env_factory, observation_space, action_space = _prepare_this_process(settings)
    from maze_cli.cli.build import trusted_targets  # (torch is loaded by now)
    from maze_cli.cli.learners import start_other_learners

    config = OmegaConf.to_container(cfg, resolve=True)
    trusted = trusted_targets(config)
    try:
        with contextlib.ExitStack() as closing:  # the other learners, stopped however this function ends
            group = start_other_learners(settings, config, closing)
            return _train(cfg, settings, config, env_factory, observation_space, action_space, trusted, resumed_from, group, started)
    except Exception as err:
        if is_disk_full(err):
            raise _stopped_by_full_disk(err, run_dir) from None
        raise


def _stopped_by_full_disk(err: Exception, run_dir: Path) -> DiskFull:
    """The one line of a run a full disk stopped: the filesystem, the file, and what to do."""
    full = err if isinstance(err, DiskFull) else DiskFull(getattr(err, "filename", None) or run_dir)
    last = run_dir / "checkpoints" / "last.pt"
    then = (f"the last good checkpoint {last} is intact: free space there, then `train resume={run_dir}` continues the run"
            if last.is_file() else "no checkpoint was written before it: free space there and start the run again")
    return DiskFull(full.path, f"{full}; training stopped, actors stopped; {then}")


def _warm_up_actor_processes(settings) -> None:
    """For a runner with a `start_method`, start the actors' forkserver now, before torch is imported
    here: it loads torch on another core meanwhile, so the first actor starts without that wait."""
    if "start_method" in settings.runner:
        from maze_cli.start_methods import warm_up_start_method

        warm_up_start_method(settings.runner.start_method)


def _prepare_this_process(settings):
    """The checks that need torch (device, learner options, the env built once and checked), then
    this process's torch threads, SIGTERM handling and learner seed, so that everything that can fail
    on the user's input fails before an actor or learner starts. Returns the env factory and the
    env's observation and action spaces."""
    import torch

    from maze_cli.cli.build import check_device, check_env
    from maze_cli.learner import check_options
    from maze_cli.seeding import derive_seed, deterministic_torch, seed_everything

    t = settings.train
    if settings.runner.get("reproducible"):
        deterministic_torch()
    check_device(t.device)
    check_options(t.learner.precision, t.learner.compile, t.device)
    signal.signal(signal.SIGTERM, _raise_terminated)
    torch.set_num_threads(t.torch_threads)
    env_factory, observation_space, action_space = check_env(settings)
    _warn_images_with_mlp(settings, observation_space)
    seed_everything(derive_seed(t.seed, "learner"))
    return env_factory, observation_space, action_space


def _train(cfg, settings, config, env_factory, observation_space, action_space, trusted, resumed_from, group, started) -> dict:
    """Build learner 0's run (the only one, or the one that evaluates and writes), train, write the results."""
    from maze_cli.callbacks import Callbacks
    from maze_cli.checkpoint import Checkpointer
    from maze_cli.cli.build import build_run, build_trackers
    from maze_cli.envs.spaces import describe_space
    from maze_cli.stats.writers import ConsoleTable, JsonlWriter, TensorBoardWriter, WritesTo

    t = settings.train
    run_dir = Path(HydraConfig.get().runtime.output_dir)
    callbacks = Callbacks(settings.callbacks)  # before anything starts: a callback that cannot be built is one line
    run = build_run(settings, env_factory, observation_space, action_space, trusted, t.trust_checkpoint, group)
    warm_started = _warm_start(run.learner, t, trusted)
    OmegaConf.save(cfg, run_dir / "config.yaml", resolve=True)
    jsonl, tensorboard = JsonlWriter(run_dir / "stats.jsonl"), TensorBoardWriter(run_dir / "tensorboard")
    files = [ConsoleTable(team=bool(getattr(env_factory, "agents", None))), jsonl, tensorboard]
    deterministic = t.eval.deterministic
    videos = _eval_videos(settings, run_dir, tensorboard, deterministic)
    trainer = _trainer(settings, run, env_factory, deterministic, files, videos, warm_started, group)
    trainer.callbacks = callbacks
    reproducible = bool(settings.runner.get("reproducible"))
    checkpointer = Checkpointer(run_dir / "checkpoints", run, trainer, config, t.checkpoint.interval, t.checkpoint.replay_buffer,
                                actors_state=reproducible, group=group)
    trainer.on_epoch_end = checkpointer.on_epoch_end
    trainer.on_best_snapshot = checkpointer.save_best_snapshot
    trainer.before_others_go_on = checkpointer.take_followers_state
    if t.resume:
        resume.restore(checkpointer, resumed_from, trainer, jsonl, tensorboard, run_dir)
        if reproducible:
            resume.restore_actors(checkpointer, resumed_from)
    if group is not None:  # every learner starts from learner 0's state: weights, optimizer, statistics (and a resume's own)
        group.broadcast_object({"learner": run.learner.state_dict(), "resume": checkpointer.followers_resume})
    log.info(f"run dir: {run_dir}")
    actors = getattr(run.runner, "actors", run.runner)  # workers with a buffer wrap their actors
    learners = "" if group is None else f" per learner, {group.world_size} learners"
    log.info(
        f"env {env_factory.describe()}: observations {describe_space(observation_space)}, actions {describe_space(action_space)}; "
        f"{_short(settings.algorithm._target_)} with {_short(settings.runner._target_)}, "
        f"{actors.n_actors} actors x {actors.envs_per_actor} envs{learners}"
    )
    if t.eval.interval > 0:
        log.info(f"evaluation: {t.eval.episodes} episodes, {'the most likely action' if deterministic else 'sampled actions'} "
                 f"(eval.deterministic={str(deterministic).lower()})"
                 f"{', in the background' if trainer.background_eval is not None else ''}")
    # last: a failure before it leaves no tracker run open; a full disk under its local files reads as for the run's own
    trackers = [WritesTo(tracker, run_dir) for tracker in build_trackers(settings.logger, run_dir, config)]
    trainer.writers += trackers
    broadcast_first = bool(t.resume or group is not None)  # (several learners: so that their policy versions agree)
    result = _run_to_the_end(run, trainer, checkpointer, files, trackers, run_dir, broadcast_first, callbacks, config)
    checkpointer.save_last(result.stop_reason)
    log.info(_summary_line(result, trainer.time_offset + result.time_s, trainer.best_eval, run_dir / "checkpoints",
                           time.perf_counter() - started))
    summary = {"stop_reason": result.stop_reason, "env_steps": result.env_steps, "time_s": result.time_s,
               "objective": objective(run_dir, t)}
    callbacks.train_end(summary)
    return summary


def _warm_start(learner, t, trusted) -> bool:
    """`init_from=`: the policy (and, if asked, its optimizer and normalizer state) from another run's
    checkpoint. Whether it happened: the trainer then evaluates before training, so the first row
    shows where the run starts from. A resumed run keeps its own weights."""
    if not t.init_from.path or t.resume:
        return False
    from maze_cli.warm_start import warm_start

    start = warm_start(learner, t.init_from.path, t.init_from.optimizer, t.init_from.normalizer, trusted, t.trust_checkpoint)
    best = (start.get("trainer") or {}).get("best_eval")
    log.info(f"init_from={t.init_from.path}: the policy starts from the checkpoint's weights"
             f"{'' if best is None else f' (its best eval return: {best:.1f})'}")
    return True


def _trainer(settings, run, env_factory, deterministic: bool, files: list, videos, warm_started: bool, group):
    """The Trainer: the run's loop under its budget, writing each epoch's row to `files`, evaluating
    the policy on the eval seeds on `eval`'s schedule (recording `videos` when on)."""
    from maze_cli.evaluation import BackgroundEvaluation, Evaluator, Snapshot
    from maze_cli.seeding import derive_seeds
    from maze_cli.training import Budget, Trainer

    t = settings.train
    evaluator = Evaluator(env_factory, t.eval.episodes, derive_seeds(t.seed, "eval_env", t.eval.episodes), t.device, deterministic)
    budget = Budget(t.max_env_steps, t.max_time_s, t.target_return, t.target_window, run.epoch_length)

    def evaluate_weights(policy, epoch: int, env_steps: int) -> dict:
        stats = evaluator(policy)
        if videos is not None:
            videos(policy, epoch, env_steps)
        return stats

    def evaluate() -> dict:
        return evaluate_weights(run.learner.policy, trainer.epoch, trainer.env_steps)

    def evaluate_snapshot(snapshot: Snapshot) -> dict:
        return evaluate_weights(snapshot.policy, snapshot.epoch, snapshot.env_steps)

    background = None
    if _background_eval(settings):
        background = BackgroundEvaluation(evaluate_snapshot, lambda: run.learner.policy)
    trainer = Trainer(run.loop, budget, files, evaluate=evaluate, eval_interval=t.eval.interval,
                      eval_interval_env_steps=t.eval.interval_env_steps, eval_interval_s=t.eval.interval_s, evaluate_first=warm_started,
                      group=group, info_keys=list(env_factory.info_stats), background_eval=background)
    return trainer


def _background_eval(settings) -> bool:
    """eval.background as set, or (null) on where a core is left over for it: the actors run in processes
    of their own (not runner=sequential, whose envs step in this process) and the machine has more cores
    than the actors and the learners' torch threads take. Never in reproducible mode."""
    t = settings.train
    if settings.runner.get("reproducible"):
        if t.eval.background:
            raise ConfigError("eval.background=true with runner.reproducible=true: a background evaluation joins the row of the "
                              "epoch in which it happens to finish, so the rows would depend on timing; set eval.background=false")
        return False
    if t.eval.background is not None:
        return bool(t.eval.background)
    n_actors = settings.runner.get("n_actors")
    if n_actors is None or "sequential" in str(settings.runner.get("_target_", "")).lower():
        return False
    busy = n_actors + t.learner.num_learners * t.torch_threads
    return (os.cpu_count() or 1) > busy


def _run_to_the_end(run, trainer, checkpointer, files: list, trackers: list, run_dir: Path, broadcast_first: bool,
                    callbacks=None, config: dict | None = None):
    """Train with the actors running (`broadcast_first`: publish the learner's weights before the
    first collect), and leave the run dir complete however training ends: a diverged loss reported
    with the last good checkpoint, last.pt written on Ctrl-C or a failed learner, every file closed,
    the learning curve drawn (while the actors stop, when training ended normally), trackers closed
    last, since one may upload the curve. The callbacks' `on_train_start` runs before the actors
    start; a callback that raises ends the run like a failed learner. Returns the Trainer's result."""
    from maze_cli.callbacks import CallbackFailed
    from maze_cli.distributed import LearnerFailure
    from maze_cli.stats.plots import draw_learning_curve, start_learning_curve

    curve, disk_full = None, False
    try:
        if callbacks:
            callbacks.train_start(run_dir, config)
        with run.runner:
            if broadcast_first:
                run.runner.broadcast_updated_policy(run.learner.policy.state_dict())
            result = trainer.run()
            checkpointer.save_actors()  # while they run: for the last.pt written below
            curve = start_learning_curve(run_dir)  # every row is written: drawn while the actors stop
    except NonFiniteLoss as err:
        last = run_dir / "checkpoints" / "last.pt"
        good = f"the last good checkpoint is {last}" if last.exists() else "no checkpoint was written before it"
        raise TrainingDiverged(
            f"{err} in epoch {trainer.epoch + 1} (after {trainer.env_steps:,} env steps); training stopped, {good} "
            f"(try a smaller algorithm.lr)"
        ) from None
    except DiskFull:  # the actors are stopped by now; no checkpoint on the way out: the disk has no room for it
        disk_full = True
        raise
    except KeyboardInterrupt:
        checkpointer.save_last("interrupted")
        log.info("interrupted: actors stopped, checkpoints/last.pt written")
        raise
    except CallbackFailed as err:
        checkpointer.save_last("callback_failed")
        raise CallbackFailed(f"{err}; the run stopped after {trainer.env_steps:,} env steps, checkpoints/last.pt written") from None
    except LearnerFailure as err:
        checkpointer.save_last("learner_failed")
        raise LearnerFailure(f"{err}; the run stopped after {trainer.env_steps:,} env steps, checkpoints/last.pt written: "
                             f"train resume={run_dir} continues it") from None
    finally:
        _close(files, failing=sys.exc_info()[1] is not None)
        if curve is not None:
            curve.join()
        elif not disk_full:
            draw_learning_curve(run_dir)
        _close(trackers, failing=sys.exc_info()[1] is not None)  # after the curve: a tracker may upload it
    return result


def _close(writers: list, failing: bool) -> None:
    """Close every writer. With an error on its way out (`failing`), a writer that fails to close
    (most often the same full disk) is only logged, so the error that stopped the run is the one said."""
    first = None
    for writer in writers:
        try:
            writer.close()
        except Exception as err:  # noqa: BLE001 - each writer closed whatever the others do
            log.debug(f"closing {type(writer).__name__} failed", exc_info=True)
            first = first or err
    if first is not None and not failing:
        raise first


def _warn_images_with_mlp(settings, observation_space) -> None:
    """An image observation with policy=mlp trains, flattened, but slowly and poorly: say so once."""
    import gymnasium as gym

    from maze_cli.envs.spaces import observation_specs

    if settings.policy.get("_target_") != "maze_cli.policies.mlp.MlpNetwork":
        return
    named = isinstance(observation_space, gym.spaces.Dict)
    images = [f"'{key}' {spec.shape}" if named else str(spec.shape) for key, spec in observation_specs(observation_space).items()
              if len(spec.shape) == 3]
    if images:
        log.warning(f"the observations hold images ({', '.join(images)}) and policy=mlp flattens them; "
                    f"policy=cnn is made for images (conv encoders)")


def _eval_videos(settings, run_dir: Path, tensorboard, deterministic: bool):
    """`eval.video=true`: the recorder of evaluation episodes (None when off)."""
    t = settings.train
    if not t.eval.video or t.eval.interval == 0:
        return None
    from maze_cli.envs.factory import EnvFactory
    from maze_cli.seeding import derive_seeds
    from maze_cli.video import EvalVideos, render_env_config

    render_factory = EnvFactory.for_policy(render_env_config(settings.env), OmegaConf.to_container(settings.policy))
    return EvalVideos(render_factory, derive_seeds(t.seed, "eval_env", t.eval.episodes)[0], run_dir / "videos", t.eval.video_interval,
                      t.device, on_video=lambda frames, step: tensorboard.add_video("eval/video", frames, step), deterministic=deterministic)


def _summary_line(result, trained_s: float, best_eval: float | None, checkpoints: Path, wall_s: float) -> str:
    """The last line of a run: why it stopped, how far it got (in all, over any resumes), and where
    the policy to use is."""
    best = (f"best eval return {best_eval:.1f}: {checkpoints / 'best.pt'}" if best_eval is not None and (checkpoints / "best.pt").exists()
            else f"no evaluation (eval.interval=0): {checkpoints / 'last.pt'}")
    return (f"done: {result.stop_reason}, {result.env_steps:,} env steps, {trained_s:.1f} s of training "
            f"({wall_s:.1f} s wall time of this command); {best}")


def _short(target: str) -> str:
    return target.rsplit(".", 1)[-1]


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


def main() -> None:
    """Console script `train`."""
    leave_quickly()
    os.environ["HYDRA_FULL_ERROR"] = "1"  # composition errors reach us; we print them for humans
    # A job a script starts in the background inherits SIGINT as ignored: `kill -INT` must still stop it gracefully.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    resume_dir = next((a.split("=", 1)[1] for a in sys.argv[1:] if a.startswith("resume=")), None)
    # `init_from=<path>` is short for init_from.path=<path>, so that init_from.optimizer=... may come beside it.
    sys.argv[1:] = [f"init_from.path={a.split('=', 1)[1]}" if a.startswith("init_from=") else a for a in sys.argv[1:]]
    if resume_dir and not any(a.startswith("hydra.run.dir=") for a in sys.argv[1:]):
        # A resumed run continues in its own dir; Hydra's record of the first command stays as it was.
        sys.argv += [f"hydra.run.dir={resume_dir}", "hydra.output_subdir=null"]
    asks_help = any(a in ("--help", "-h") for a in sys.argv[1:])
    if (resume_dir or asks_help) and not any(a.startswith(("tuning=", "+env=", "env=")) for a in sys.argv[1:]):
        # train.yaml picks tuning/<env>_<algorithm>; a resumed run names no env (its saved config holds every
        # value), nor need `train --help`.
        sys.argv.append("tuning=none")
    try:
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
