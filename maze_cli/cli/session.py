"""A run's session, once its config is valid: build the parts, train under the budget, and leave the
run dir complete however training ends (rows, checkpoints, learning curve, trackers closed).

Everything that can fail on the user's input fails before an actor or learner starts.
"""

from __future__ import annotations

import contextlib
import logging
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gymnasium as gym
import torch
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf, open_dict

from maze_cli.algorithms.base import Run
from maze_cli.callbacks import CallbackFailed, Callbacks
from maze_cli.checkpoint import Checkpointer
from maze_cli.cli import resume
from maze_cli.cli.build import available_cores, build_run, build_trackers, check_device, check_env, learner_threads, trusted_targets
from maze_cli.cli.learners import start_other_learners
from maze_cli.cli.paths import RUN_DIR_FIX
from maze_cli.cli.sweep import objective
from maze_cli.config.schema import TrainConfig
from maze_cli.cli.settings import MLP_TARGET, Settings, choose_cnn
from maze_cli.disk import DiskFull, check_writable_dir, is_disk_full, quiet_full_disk_in_log_files
from maze_cli.distributed import LearnerFailure, LearnerGroup
from maze_cli.envs.factory import EnvFactory
from maze_cli.envs.spaces import describe_space, image_shapes
from maze_cli.errors import ConfigError, NonFiniteLoss, TrainingDiverged
from maze_cli.evaluation import BackgroundEvaluation, Evaluator, Snapshot
from maze_cli.interrupts import raise_terminated_on_sigterm
from maze_cli.precision import check_options
from maze_cli.seeding import derive_seed, derive_seeds, deterministic_torch, seed_everything
from maze_cli.start_methods import warm_up_start_method
from maze_cli.stats.plots import draw_learning_curve, start_learning_curve
from maze_cli.stats.writers import ConsoleTable, JsonlWriter, StatsWriter, TensorBoardWriter, WritesTo
from maze_cli.budget import Budget
from maze_cli.training import Trainer, TrainResult
from maze_cli.video import EvalVideos, render_env_config
from maze_cli.warm_start import warm_start

log = logging.getLogger("maze_cli")


def run_session(cfg: DictConfig, settings: Settings, run_dir: Path, resumed_from: dict[str, Any] | None, started: float) -> dict:
    """Train the run `settings` describe in `run_dir` (`resumed_from`: the last.pt of a resumed run).
    Returns the run's summary; a full disk ends it with one line saying what is intact."""
    check_writable_dir(run_dir, "the run dir", RUN_DIR_FIX)
    quiet_full_disk_in_log_files()
    _warm_up_actor_processes(settings)
    env_factory, observation_space, action_space = prepare_this_process(settings)
    choose_policy_for_images(cfg, settings, observation_space)
    if env_factory.config.get("obs_keys") != settings.env.get("obs_keys"):  # chosen by what the env observes: config.yaml says so
        settings.env["obs_keys"] = env_factory.config["obs_keys"]
        with open_dict(cfg):
            cfg.env.obs_keys = env_factory.config["obs_keys"]
    config = OmegaConf.to_container(cfg, resolve=True)
    trusted = trusted_targets(config)
    try:
        with contextlib.ExitStack() as closing:  # the other learners, stopped however this function ends
            group = start_other_learners(settings, config, closing)
            return _train(cfg, settings, config, env_factory, observation_space, action_space, trusted, resumed_from, group,
                          run_dir, started)
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


def _warm_up_actor_processes(settings: Settings) -> None:
    """For a runner with a `start_method`, start the actors' forkserver now: it loads torch on
    another core meanwhile, so the first actor starts without that wait."""
    if "start_method" in settings.runner:
        warm_up_start_method(settings.runner.start_method)


def prepare_this_process(settings: Settings) -> tuple[EnvFactory, gym.Space, gym.Space]:
    """The checks that need torch (device, learner options, the env built once and checked), then
    this process's torch threads, SIGTERM handling and learner seed, so that everything that can fail
    on the user's input fails before an actor or learner starts. Returns the env factory and the
    env's observation and action spaces."""
    t = settings.train
    if settings.runner.get("reproducible"):
        deterministic_torch()
    check_device(t.device)
    check_options(t.learner.precision, t.learner.compile, t.device)
    raise_terminated_on_sigterm()
    torch.set_num_threads(learner_threads(settings))
    env_factory, observation_space, action_space = check_env(settings)
    seed_everything(derive_seed(t.seed, "learner"))
    return env_factory, observation_space, action_space


SCREEN_SIDE = 32  # images at least this big a side are frames of a screen: policy=cnn where policy=mlp was the default


def choose_policy_for_images(cfg: DictConfig, settings: Settings, observation_space: gym.Space) -> None:
    """Observations that hold frames of a screen (images of `SCREEN_SIDE` pixels a side or more) get `policy=cnn`'s
    network where the run took policy=mlp only as the default (`choose_cnn`), said in the log: an MLP flattens a
    frame into tens of thousands of inputs. Small grids (MiniGrid's 7x7 view) stay with the MLP, which reads them
    well. The MLP stays, with a warning that conv encoders fit images, where the run named policy=mlp, resumes or
    warm-starts an MLP's weights, or is a population's member (whose config, as the population's driver composed
    it, is not this process's to change)."""
    if settings.policy.get("_target_") != MLP_TARGET:
        return
    named = isinstance(observation_space, gym.spaces.Dict)
    shapes = image_shapes(observation_space)
    images = ", ".join(f"'{key}' {shape}" if named else str(shape) for key, shape in shapes.items())
    if not images:
        return
    t = settings.train
    screens = [shape for shape in shapes.values() if sorted(shape)[-2] >= SCREEN_SIDE]
    if not screens or _named_on_command_line("policy") or t.resume or t.init_from.path:
        log.warning(f"the observations hold images ({images}) and policy=mlp flattens them; policy=cnn is made for images "
                    f"(conv encoders)")
        return
    choose_cnn(cfg, settings)
    log.info(f"policy: cnn, chosen for this env: its observations hold images of a screen, {images}; policy=mlp keeps the MLP")


@dataclass
class OpenRun:
    """A run built and ready to train: its parts, its trainer (writing `files`) and its checkpointer."""

    run: Run
    trainer: Trainer
    checkpointer: Checkpointer
    files: list[StatsWriter]
    callbacks: Callbacks


def open_run(cfg: DictConfig, settings: Settings, config: dict[str, Any], env_factory: EnvFactory, observation_space: gym.Space,
             action_space: gym.Space, trusted: frozenset[str], resumed_from: dict[str, Any] | None, group: LearnerGroup | None,
             run_dir: Path, console: bool = True) -> OpenRun:
    """Build learner 0's run (the only one, or the one that evaluates and writes) in `run_dir`: its
    config.yaml, files (the console table too, with `console`), trainer and checkpointer, restored
    from `resumed_from` when resumed; the actors are not started yet."""
    t = settings.train
    callbacks = Callbacks(settings.callbacks)  # before anything starts: a callback that cannot be built is one line
    run = build_run(settings, env_factory, observation_space, action_space, trusted, t.trust_checkpoint, group)
    warm_started = _warm_start(run.learner, t, trusted)
    with open_dict(cfg):  # the keys the algorithm chose by what the env is, as they ran (config.yaml, trackers, checkpoints)
        cfg.algorithm.update(run.chosen)
    config["algorithm"].update(run.chosen)
    OmegaConf.save(cfg, run_dir / "config.yaml", resolve=True)
    jsonl, tensorboard = JsonlWriter(run_dir / "stats.jsonl"), TensorBoardWriter(run_dir / "tensorboard")
    files = [*([ConsoleTable(team=bool(env_factory.agents))] if console else []), jsonl, tensorboard]
    videos = _eval_videos(settings, run_dir, tensorboard)
    checkpointer = _checkpointer(settings, run, config, run_dir, group)
    trainer = _trainer(settings, run, env_factory, files, videos, warm_started, group, callbacks, checkpointer)
    if t.resume:
        resume.restore(checkpointer, resumed_from, trainer, jsonl, tensorboard, run_dir)
        if settings.runner.get("reproducible"):
            resume.restore_actors(checkpointer, resumed_from)
    if group is not None:  # every learner starts from learner 0's state: weights, optimizer, statistics (and a resume's own)
        group.broadcast_object({"learner": run.learner.state_dict(), "resume": checkpointer.followers_resume})
    _log_start(settings, run, env_factory, observation_space, action_space, trainer, group, run_dir)
    return OpenRun(run, trainer, checkpointer, files, callbacks)


def _train(cfg: DictConfig, settings: Settings, config: dict[str, Any], env_factory: EnvFactory, observation_space: gym.Space,
           action_space: gym.Space, trusted: frozenset[str], resumed_from: dict[str, Any] | None, group: LearnerGroup | None,
           run_dir: Path, started: float) -> dict:
    """Build learner 0's run, train, write the results."""
    t = settings.train
    opened = open_run(cfg, settings, config, env_factory, observation_space, action_space, trusted, resumed_from, group, run_dir)
    run, trainer, checkpointer, files, callbacks = opened.run, opened.trainer, opened.checkpointer, opened.files, opened.callbacks
    # last: a failure before it leaves no tracker run open; a full disk under its local files reads as for the run's own
    trackers = [WritesTo(tracker, run_dir) for tracker in build_trackers(settings.logger, run_dir, config)]
    broadcast_first = bool(t.resume or group is not None)  # (several learners: so that their policy versions agree)
    result = _run_to_the_end(run, trainer, checkpointer, files, trackers, run_dir, broadcast_first, callbacks, config)
    checkpointer.save_last(trainer, result.stop_reason)
    log.info(_summary_line(result, trainer.time_offset + result.time_s, trainer.best_eval, run_dir / "checkpoints",
                           time.perf_counter() - started, t.eval.interval > 0))
    summary = {"stop_reason": result.stop_reason, "env_steps": result.env_steps, "time_s": result.time_s,
               "objective": objective(run_dir, t)}
    callbacks.train_end(summary)
    return summary


def _checkpointer(settings: Settings, run: Run, config: dict[str, Any], run_dir: Path, group: LearnerGroup | None) -> Checkpointer:
    """last.pt on the checkpoint interval and at the end, best.pt on a new best evaluation; called
    by the trainer at those moments."""
    t = settings.train
    return Checkpointer(run_dir / "checkpoints", run, config, t.checkpoint.interval, t.checkpoint.replay_buffer,
                        actors_state=bool(settings.runner.get("reproducible")), group=group)


def _log_start(settings: Settings, run: Run, env_factory: EnvFactory, observation_space: gym.Space, action_space: gym.Space,
               trainer: Trainer, group: LearnerGroup | None, run_dir: Path) -> None:
    """The run's first lines: where it writes, the env and its spaces, the algorithm, the actors, the evaluation."""
    t = settings.train
    log.info(f"run dir: {run_dir}")
    actors = run.runner.distributed_actors
    learners = "" if group is None else f" per learner, {group.world_size} learners"
    log.info(
        f"env {env_factory.describe()}: observations {describe_space(observation_space)}, actions {describe_space(action_space)}; "
        f"{_short(settings.algorithm._target_)} with {_short(settings.runner._target_)}, "
        f"{actors.n_actors} actors x {actors.envs_per_actor} envs{learners}, {torch.get_num_threads()} torch threads per learner"
    )
    _log_algorithm_choice(settings, run)
    if t.eval.interval > 0:
        deterministic = t.eval.deterministic
        log.info(f"evaluation: {t.eval.episodes} episodes, {'the most likely action' if deterministic else 'sampled actions'} "
                 f"(eval.deterministic={str(deterministic).lower()})"
                 f"{', in the background' if trainer.background_eval is not None else ''}")


def _named_on_command_line(group: str) -> bool:
    """Whether this command chose `group` (`group=<option>`, `+group=...`). A process Hydra did not compose (a
    population's member) counts as having chosen: its config is the one its driver composed, not its own to change."""
    if not HydraConfig.initialized():
        return True
    return any(o.split("=", 1)[0].lstrip("+~") == group for o in HydraConfig.get().overrides.task)


def _log_algorithm_choice(settings: Settings, run: Run) -> None:
    """Say where the algorithm came from (the command line, or the default for this env) and what it chose by
    what the env is: a run that names only its env tells what it got and how to change it."""
    named = _named_on_command_line("algorithm")
    chosen = ", ".join(f"algorithm.{key}={str(value).lower()}" for key, value in run.chosen.items())
    if not named:
        log.info(f"algorithm: {_short(settings.algorithm._target_)}, the default for this env (algorithm=impala|ppo|appo|sac|td3|dqn "
                 f"chooses another){f'; chosen for this env: {chosen}' if chosen else ''}")
    elif chosen:
        log.info(f"chosen for this env: {chosen}")


def _warm_start(learner, t: TrainConfig, trusted: frozenset[str]) -> bool:
    """`init_from=`: the policy (and, if asked, its optimizer and normalizer state) from another run's
    checkpoint. Whether it happened: the trainer then evaluates before training, so the first row
    shows where the run starts from. A resumed run keeps its own weights."""
    if not t.init_from.path or t.resume:
        return False
    start = warm_start(learner, t.init_from.path, t.init_from.optimizer, t.init_from.normalizer, trusted, t.trust_checkpoint)
    best = (start.get("trainer") or {}).get("best_eval")
    log.info(f"init_from={t.init_from.path}: the policy starts from the checkpoint's weights"
             f"{'' if best is None else f' (its best eval return: {best:.1f})'}")
    return True


def _trainer(settings: Settings, run: Run, env_factory: EnvFactory, files: list[StatsWriter], videos: EvalVideos | None,
             warm_started: bool, group: LearnerGroup | None, callbacks: Callbacks, checkpointer: Checkpointer) -> Trainer:
    """The Trainer: the run's loop under its budget, writing each epoch's row to `files`, evaluating
    the policy on the eval seeds on `eval`'s schedule (recording `videos` when on)."""
    t = settings.train
    evaluator = Evaluator(env_factory, t.eval.episodes, derive_seeds(t.seed, "eval_env", t.eval.episodes), t.device,
                          t.eval.deterministic, t.eval.max_episode_steps)
    budget = Budget(t.max_env_steps, t.max_time_s, t.target_return, t.target_window, run.epoch_length)

    def evaluate_weights(policy: torch.nn.Module, epoch: int, env_steps: int) -> dict:
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
                      group=group, info_keys=list(env_factory.info_stats), background_eval=background, callbacks=callbacks,
                      on_epoch_end=checkpointer.on_epoch_end, on_best_snapshot=checkpointer.save_best_snapshot,
                      before_others_go_on=checkpointer.take_followers_state)
    return trainer


def _background_eval(settings: Settings) -> bool:
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
    busy = n_actors + t.learner.num_learners * learner_threads(settings)
    return available_cores() > busy


def _eval_videos(settings: Settings, run_dir: Path, tensorboard: TensorBoardWriter) -> EvalVideos | None:
    """`eval.video=true`: the recorder of evaluation episodes (None when off)."""
    t = settings.train
    if not t.eval.video or t.eval.interval == 0:
        return None
    render_factory = EnvFactory.for_policy(render_env_config(settings.env), OmegaConf.to_container(settings.policy))
    return EvalVideos(render_factory, derive_seeds(t.seed, "eval_env", t.eval.episodes)[0], run_dir / "videos", t.eval.video_interval,
                      t.device, on_video=lambda frames, step: tensorboard.add_video("eval/video", frames, step),
                      deterministic=t.eval.deterministic, max_steps=t.eval.max_episode_steps)


def _run_to_the_end(run: Run, trainer: Trainer, checkpointer: Checkpointer, files: list[StatsWriter], trackers: list[StatsWriter],
                    run_dir: Path, broadcast_first: bool, callbacks: Callbacks | None = None,
                    config: dict[str, Any] | None = None) -> TrainResult:
    """Train with the actors running (`broadcast_first`: publish the learner's weights before the
    first collect), and leave the run dir complete however training ends: a diverged loss reported
    with the last good checkpoint, last.pt written on Ctrl-C or a failed learner, every file closed,
    the learning curve drawn (while the actors stop, when training ended normally), trackers closed
    last, since one may upload the curve. The callbacks' `on_train_start` runs before the actors
    start; a callback that raises ends the run like a failed learner. Returns the Trainer's result."""
    curve, disk_full = None, False
    try:
        if callbacks:
            callbacks.train_start(run_dir, config)
        with run.runner:
            if broadcast_first:
                run.runner.broadcast_updated_policy(run.learner.policy.state_dict())
            result = trainer.run(trackers)
            checkpointer.save_actors(trainer.env_steps)  # while they run: for the last.pt written below
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
        checkpointer.save_last(trainer, "interrupted")
        log.info("interrupted: actors stopped, checkpoints/last.pt written")
        raise
    except CallbackFailed as err:
        checkpointer.save_last(trainer, "callback_failed")
        raise CallbackFailed(f"{err}; the run stopped after {trainer.env_steps:,} env steps, checkpoints/last.pt written") from None
    except LearnerFailure as err:
        checkpointer.save_last(trainer, "learner_failed")
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


def _close(writers: list[StatsWriter], failing: bool) -> None:
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


def _summary_line(result: TrainResult, trained_s: float, best_eval: float | None, checkpoints: Path, wall_s: float,
                  evaluating: bool = True) -> str:
    """The last line of a run: why it stopped, how far it got (in all, over any resumes), and where
    the policy to use is."""
    why_none = "no evaluation succeeded (the warnings above say why)" if evaluating else "no evaluation (eval.interval=0)"
    best = (f"best eval return {best_eval:.1f}: {checkpoints / 'best.pt'}" if best_eval is not None and (checkpoints / "best.pt").exists()
            else f"{why_none}: {checkpoints / 'last.pt'}")
    return (f"done: {result.stop_reason}, {result.env_steps:,} env steps, {trained_s:.1f} s of training "
            f"({wall_s:.1f} s wall time of this command); {best}")


def _short(target: str) -> str:
    """A class's name without its module, for the log."""
    return target.rsplit(".", 1)[-1]
