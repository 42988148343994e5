"""`train ... pbt.population=N`: a population trained by Ray Tune's PBT scheduler (or PB2), each member an
ordinary run in `member_<i>/` of the run dir (maze_cli.cli.member). The driver records every exploit
in pbt.jsonl, shows one line per member per interval, and leaves the best member's best.pt at the top."""

from __future__ import annotations

import logging
import math
import os
import shutil
import time
from functools import partial
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from maze_cli.cli.settings import Settings
from maze_cli.errors import ConfigError, MazeCliError
from maze_cli.pbt import journal
from maze_cli.pbt.journal import member_dir, score_of
from maze_cli.pbt.mutations import Mutation, check_mutations, describe
from maze_cli.parallel.ray_cluster import connect, import_ray
from maze_cli.stats.writers import read_rows

log = logging.getLogger("maze_cli")


MEMBER_RESTARTS = 3  # a member that fails is started again from its last checkpoint this many times


class PopulationFailed(MazeCliError, RuntimeError):
    """A member of the population failed; the others ran to their end."""


def check_population(settings: Settings) -> list[Mutation]:
    """The population's keys, checked before anything starts (one line naming the bad key)."""
    pbt, t = settings.train.pbt, settings.train
    mutations = check_mutations(pbt.mutations, settings.algorithm)
    if pbt.interval_env_steps >= t.max_env_steps:
        raise ConfigError(f"pbt.interval_env_steps={pbt.interval_env_steps:,} leaves no exploit within max_env_steps="
                          f"{t.max_env_steps:,} (each member's budget); make it a fraction of it, e.g. "
                          f"pbt.interval_env_steps={max(1, t.max_env_steps // 10)}")
    if t.learner.num_learners > 1:
        raise ConfigError("pbt.population with learner.num_learners > 1 is not supported; one learner per member")
    return mutations


def run_population(cfg: DictConfig, settings: Settings, run_dir: Path, started: float) -> dict:
    """Train the population and summarise it; returns the run's summary (its objective: the best member's score)."""
    mutations = check_population(settings)
    pbt = settings.train.pbt
    os.environ.setdefault("TUNE_DISABLE_AUTO_CALLBACK_LOGGERS", "1")  # maze_cli's members write their own files
    os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")  # Tune's own tables stay off the console (verbose=0)
    ray = import_ray()
    from ray import tune

    from maze_cli.cli.member import Member

    connected = connect(settings.runner.get("address"), pbt.population, "the population's members", log_to_driver=False)
    try:
        cpus = ray.cluster_resources().get("CPU", 1.0)
        base = OmegaConf.to_container(cfg, resolve=True)
        base["pbt"]["population"] = 0  # each member is an ordinary run
        start = {m.key: OmegaConf.select(cfg, m.key) for m in mutations}
        scheduler = _scheduler(pbt, mutations, run_dir)
        tuner = tune.Tuner(
            tune.with_resources(Member, partial(_member_resources, cpus / pbt.population)),
            param_space={"index": tune.grid_search(list(range(pbt.population))), "run_dir": str(run_dir.resolve()), "base": base,
                         **start},
            tune_config=tune.TuneConfig(scheduler=scheduler, reuse_actors=True),
            run_config=tune.RunConfig(name="tune", storage_path=str(run_dir.resolve()), verbose=0,
                                      callbacks=[_member_lines(mutations)], log_to_file=False,
                                      failure_config=tune.FailureConfig(max_failures=MEMBER_RESTARTS)),
        )
        log.info(f"pbt: {pbt.population} members in {run_dir}/member_<i>, {pbt.scheduler} every {pbt.interval_env_steps:,} "
                 f"env steps over {', '.join(f'{m.key} [{m.low:g}, {m.high:g}]' for m in mutations)}")
        tune_log = logging.getLogger("ray.tune")
        level, tune_log.level = tune_log.level, logging.CRITICAL  # its notes and tracebacks: a member's failure is said here
        try:
            results = tuner.fit()
        finally:
            tune_log.setLevel(level)
        _prune_handed_checkpoints(run_dir / "tune")
    finally:
        if connected:
            ray.shutdown()
    return _summary(run_dir, results, start, started)


def _prune_handed_checkpoints(tune_dir: Path) -> None:
    """Once the population is done: of the checkpoints Tune handed between members, each member's newest
    alone. (While it runs every one is kept: a member may copy another's checkpoint of some intervals
    ago, which a pruning meanwhile would have deleted under it.)"""
    for trial in tune_dir.glob("*/"):
        handed = sorted(trial.glob("checkpoint_*"))
        for old in handed[:-1]:
            shutil.rmtree(old, ignore_errors=True)


def _member_resources(cpus: float, config: dict) -> dict:
    """What a member asks of Ray: its share of the CPUs, a hair less for each member after the first.
    Tune hands a paused member's process (kept with reuse_actors) to the next member asking for the
    same resources; asking for amounts of its own, each member gets its own process back, where its
    run and its actors still are, rather than another member's to rebuild."""
    return {"cpu": cpus - 1e-3 * config["index"]}


def _scheduler(pbt: Any, mutations: list[Mutation], run_dir: Path):
    """Ray Tune's PopulationBasedTraining (or PB2) over `mutations`, each exploit written to pbt.jsonl."""
    from ray import tune
    from ray.tune.schedulers import PopulationBasedTraining

    by_key = {m.key: m for m in mutations}

    def within_ranges(config: dict) -> dict:
        for key, mutation in by_key.items():
            config[key] = mutation.clip(config[key])
        return config

    common = dict(time_attr="env_steps", metric="score", mode="max", perturbation_interval=pbt.interval_env_steps,
                  quantile_fraction=pbt.quantile_fraction, synch=pbt.synchronous, log_config=False)
    if pbt.scheduler == "pb2":
        try:
            from ray.tune.schedulers.pb2 import PB2
        except ImportError as err:
            raise ConfigError(f"pbt.scheduler=pb2 needs {err.name}: pip install scikit-learn GPy, or pbt.scheduler=pbt") from None
        return _recorded(PB2)(run_dir, by_key, hyperparam_bounds={k: [m.low, m.high] for k, m in by_key.items()}, **common)
    space = {k: tune.loguniform(m.low, m.high) if m.log_scale else tune.uniform(m.low, m.high) for k, m in by_key.items()}
    return _recorded(PopulationBasedTraining)(run_dir, by_key, hyperparam_mutations=space, custom_explore_fn=within_ranges,
                                              resample_probability=pbt.resample_probability, **common)


def _recorded(scheduler: type) -> type:
    """`scheduler` that writes each exploit and explore into pbt.jsonl and says it in one line."""

    from ray.tune.experiment import Trial
    from ray.tune.schedulers import TrialScheduler

    class Recorded(scheduler):
        def __init__(self, run_dir: Path, mutations: dict[str, Mutation], **options: Any):
            super().__init__(**options)
            self._run_dir, self._keys = run_dir, list(mutations)

        def on_trial_result(self, tune_controller, trial, result):
            """As the scheduler decides, except that a member never pauses to let a waiting one run: the
            population is sized so that every member runs at once (Tune's asynchronous PBT pauses a
            member whenever another is pending, so that one exploit would stop and rebuild them all)."""
            decision = super().on_trial_result(tune_controller, trial, result)
            if decision == TrialScheduler.PAUSE and not self._synch and trial.status != Trial.PAUSED:
                return TrialScheduler.CONTINUE
            return decision

        def _checkpoint_or_exploit(self, trial, tune_controller, upper_quantile, lower_quantile):
            """A member at the bottom copies one at the top; every other member saves its checkpoint at
            each report. (The scheduler saves only a member that is at the top at its own report, so
            with members reporting one by one the member at the top when another reports had often
            no checkpoint to copy, and the copy was skipped.)"""
            if trial in lower_quantile:
                super()._checkpoint_or_exploit(trial, tune_controller, upper_quantile, lower_quantile)
            else:
                super()._checkpoint_or_exploit(trial, tune_controller, [trial], [])

        def _get_new_config(self, trial, trial_to_clone):
            """The clone's explored values of the changed keys, and the member's own everything else
            (which member it is, its run dir): the scheduler copies the whole config otherwise."""
            explored, operations = super()._get_new_config(trial, trial_to_clone)
            return {**trial.config, **{key: explored[key] for key in self._keys}}, operations

        def _exploit(self, tune_controller, trial, trial_to_clone):
            """The member copies `trial_to_clone`'s newest checkpoint and explores, in its own process at
            the start of its next interval (a copy order in its dir: maze_cli.cli.member), where the
            scheduler would pause it and start its process anew from the checkpoint: a copy costs a
            checkpoint's load, not a start of the member's run and actors."""
            state, donor = self._trial_state[trial], self._trial_state[trial_to_clone]
            before = {key: trial.config[key] for key in self._keys}
            new_config, _ = self._get_new_config(trial, trial_to_clone)
            after = {key: new_config[key] for key in self._keys}
            trial.set_config(new_config)
            journal.order_copy(member_dir(Path(trial.config["run_dir"]), trial.config["index"]), donor.last_checkpoint.path,
                               after, trial_to_clone.config["index"])
            self._num_perturbations += 1
            state.last_perturbation_time, state.last_train_time = donor.last_perturbation_time, donor.last_train_time
            row = {"env_steps": (state.last_result or {}).get("env_steps"), "member": trial.config["index"],
                   "copied": trial_to_clone.config["index"], "score": state.last_score, "copied_score": donor.last_score,
                   "before": before, "after": after}
            journal.record(self._run_dir, row)
            log.info(f"pbt: member {row['member']} (score {row['score']:.2f}) copies member {row['copied']} "
                     f"(score {row['copied_score']:.2f}) at {row['env_steps']:,} env steps: {describe(after)}")

    return Recorded


def _member_lines(mutations: list[Mutation]):
    """A Tune callback that shows one console line per member per interval (Tune's own reporter is off)."""
    from ray import tune

    class MemberLines(tune.Callback):
        def on_trial_result(self, iteration, trials, trial, result, **info):
            values = ", ".join(f"{m.name}={trial.config[m.key]:.4g}" for m in mutations)
            score = result.get("score")
            shown = "n/a" if score is None or math.isnan(score) else f"{score:.2f}"
            log.info(f"member {trial.config['index']}: {result['env_steps']:>10,} env steps, score {shown}, {values}")

        def on_trial_recover(self, iteration, trials, trial, **info):
            index = trial.config["index"]
            log.warning(f"member {index} failed; started again from its last checkpoint (Ray Tune's error.txt under "
                        f"{trial.config['run_dir']}/tune says why)")

        def on_trial_error(self, iteration, trials, trial, **info):
            index = trial.config["index"]
            log.warning(f"member {index} failed: see {trial.config['run_dir']}/member_{index}/train.log")

    return MemberLines()


def _summary(run_dir: Path, results: Any, start: dict[str, float], started: float) -> dict:
    """The best member (by its best evaluation, or its last training window without evaluation), its
    best.pt at the top, pbt.png, and the run's summary."""
    members = sorted(run_dir.glob("member_*"), key=lambda p: int(p.name.split("_")[1]))
    scores = {int(m.name.split("_")[1]): _best_score(read_rows(m / "stats.jsonl")) for m in members}
    scored = {index: score for index, score in scores.items() if score is not None}
    best = max(scored, key=scored.get) if scored else None
    if best is not None:
        source = member_dir(run_dir, best) / "checkpoints"
        chosen = source / "best.pt" if (source / "best.pt").is_file() else source / "last.pt"
        if chosen.is_file():
            (run_dir / "checkpoints").mkdir(exist_ok=True)
            shutil.copyfile(chosen, run_dir / "checkpoints" / "best.pt")
    try:
        plot = journal.draw_population(run_dir, members, start)
    except Exception as err:  # noqa: BLE001 - a figure never costs the run
        log.warning(f"pbt.png not drawn: {err}")
        plot = None
    exploits = len(journal.read(run_dir))
    shown = "none scored" if best is None else f"best member {best} (score {scored[best]:.2f}); checkpoints/best.pt is its best.pt"
    log.info(f"pbt: {len(members)} members, {exploits} exploits, {shown}; {run_dir / journal.JOURNAL}"
             f"{', ' + str(plot) if plot else ''}; {time.perf_counter() - started:.0f} s")
    if any(r.error is None and not (r.metrics or {}).get("done") for r in results):  # Tune stopped them on Ctrl-C
        log.info("interrupted: every member stopped (each member's stats and checkpoints up to its last interval are in its dir)")
        raise KeyboardInterrupt
    failed = [r.config.get("index") for r in results if r.error is not None]
    if failed:
        raise PopulationFailed(f"member{'s' if len(failed) > 1 else ''} {', '.join(map(str, failed))} failed: see "
                               f"{run_dir}/member_<i>/train.log and Ray Tune's error.txt under {run_dir / 'tune'}")
    return {"stop_reason": "pbt", "env_steps": None, "time_s": time.perf_counter() - started,
            "objective": scored[best] if best is not None else float("nan")}


def _best_score(rows: list[dict[str, Any]]) -> float | None:
    """A member's best: its best evaluation where it evaluated, else its last training window's mean."""
    evaluated = [row["eval/return_mean"] for row in rows if row.get("eval/return_mean") is not None]
    return max(evaluated) if evaluated else score_of(rows)
