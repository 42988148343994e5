"""`train ... pbt.population=N`: a population trained by Ray Tune's PBT scheduler (or PB2), each member an
ordinary run in `member_<i>/` of the run dir (maze_cli.cli.member). The driver records every exploit
in pbt.jsonl, shows one line per member per interval, and leaves the best member's best.pt at the top."""

from __future__ import annotations

import logging
import math
import os
import random
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
    """The population's keys and its env, checked before anything starts (one line naming the bad key):
    a member that cannot build its env would fail, and be started again, MEMBER_RESTARTS times each."""
    from maze_cli.cli.build import check_env

    pbt, t = settings.train.pbt, settings.train
    mutations = check_mutations(pbt.mutations, settings.algorithm)
    if pbt.interval_env_steps >= t.max_env_steps:
        raise ConfigError(f"pbt.interval_env_steps={pbt.interval_env_steps:,} leaves no exploit within max_env_steps="
                          f"{t.max_env_steps:,} (each member's budget); make it a fraction of it, e.g. "
                          f"pbt.interval_env_steps={max(1, t.max_env_steps // 10)}")
    if t.learner.num_learners > 1:
        raise ConfigError("pbt.population with learner.num_learners > 1 is not supported; one learner per member")
    check_env(settings)  # (last: it builds an env, the checks above read the config)
    return mutations


def run_population(cfg: DictConfig, settings: Settings, run_dir: Path, started: float) -> dict:
    """Train the population and summarise it; returns the run's summary (its objective: the best member's score)."""
    mutations = check_population(settings)
    pbt = settings.train.pbt
    os.environ.setdefault("TUNE_DISABLE_AUTO_CALLBACK_LOGGERS", "1")  # maze_cli's members write their own files
    os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")  # Tune's own tables stay off the console (verbose=0)
    ray = import_ray()
    start = {m.key: OmegaConf.select(cfg, m.key) for m in mutations}  # every member's first values
    values = {index: dict(start) for index in range(pbt.population)}  # each member's values as it (re)starts
    if settings.train.resume:
        done = _finished(settings, run_dir)
        if done is not None:
            print(done)  # not logged: train.log stays as it was
            return {"stop_reason": "finished", "env_steps": None, "time_s": 0.0, "objective": _objective(run_dir)}
        values = _resumed_values(run_dir, start, pbt.population)
    OmegaConf.save(cfg, run_dir / "config.yaml", resolve=True)  # what `resume=<run dir>` goes on with
    ray_actors = _ray_actor_cpus(settings)
    connected = connect(settings.runner.get("address"), pbt.population * (1 + ray_actors), "the population's members"
                        + (" and their Ray actors" if ray_actors else ""), log_to_driver=False)
    try:
        tuner = _tuner(cfg, settings, values, _member_needs(ray, settings, ray_actors), mutations, run_dir)
        log.info(f"pbt: {pbt.population} members in {run_dir}/member_<i>, {pbt.scheduler} every {pbt.interval_env_steps:,} "
                 f"env steps over {', '.join(f'{m.key} [{m.low:g}, {m.high:g}]' for m in mutations)}"
                 + ("; resumed: each member goes on from its last checkpoint with its values" if settings.train.resume else ""))
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


def _tuner(cfg: DictConfig, settings: Settings, values: dict[int, dict[str, float]], needs: dict[str, float],
           mutations: list[Mutation], run_dir: Path) -> Any:
    """Ray Tune's Tuner of the population: a Member per index asking Ray for `needs`, starting from its
    `values` of the changed keys, under the PBT (or PB2) scheduler; its state in `run_dir/tune`."""
    from ray import tune

    from maze_cli.cli.member import Member

    pbt = settings.train.pbt
    base = OmegaConf.to_container(cfg, resolve=True)
    base["pbt"]["population"], base["resume"] = 0, None  # each member is an ordinary run, resumed by itself
    return tune.Tuner(
        tune.with_resources(Member, partial(_member_resources, needs)),
        param_space={"index": tune.grid_search(list(range(pbt.population))), "run_dir": str(run_dir.resolve()), "base": base,
                     "resumed": bool(settings.train.resume),
                     **{m.key: tune.sample_from(partial(_value_of, values, m.key)) for m in mutations}},
        tune_config=tune.TuneConfig(scheduler=_scheduler(pbt, mutations, run_dir, settings.train.seed), reuse_actors=True),
        run_config=tune.RunConfig(name="tune", storage_path=str(run_dir.resolve()), verbose=0,
                                  log_to_file=False,
                                  failure_config=tune.FailureConfig(max_failures=MEMBER_RESTARTS)),
    )


def _value_of(values: dict[int, dict[str, float]], key: str, spec: Any) -> float:
    """A member's value of `key` as it starts (Tune resolves it once the member's index is drawn)."""
    return values[spec.config["index"]][key]


def _resumed_values(run_dir: Path, start: dict[str, float], population: int) -> dict[int, dict[str, float]]:
    """Each member's values of the changed keys where the population stopped (its last explore in
    pbt.jsonl, else the start); copy orders it had not yet carried out are dropped, as the checkpoints
    they name may be gone (it copies anew at its next interval if it is still at the bottom)."""
    rows = journal.read(run_dir)
    values = {}
    for index in range(population):
        journal.take_copy_order(member_dir(run_dir, index))
        values[index] = {key: series[-1][1] for key, series in journal.values_over_steps(rows, index, start).items()}
    return values


def _finished(settings: Settings, run_dir: Path) -> str | None:
    """For a resumed population whose every member reached its stop condition under this command's
    budget: the message saying so and which key would extend it; None if any has more to do."""
    from maze_cli.checkpoint import load_checkpoint
    from maze_cli.cli.resume import extension
    from maze_cli.errors import CorruptCheckpoint

    extend = None
    for index in range(settings.train.pbt.population):
        last = member_dir(run_dir, index) / "checkpoints" / "last.pt"
        try:
            saved = load_checkpoint(last, settings.train.trust_checkpoint, where=str(last)) if last.is_file() else None
        except CorruptCheckpoint:
            return None  # (the member falls back on an older checkpoint of its own, saying so)
        extend = None if saved is None else extension(saved, settings.train)
        if extend is None:
            return None
    return f"resume={run_dir}: every member of the population is finished; nothing was changed. To train on, raise {extend}"


def _objective(run_dir: Path) -> float:
    """The population's objective: its best member's score."""
    return max(_member_scores(sorted(run_dir.glob("member_*"))).values(), default=float("nan"))


def _member_scores(members: list[Path]) -> dict[int, float]:
    """Each scored member's best (`_best_score`), by its index."""
    scores = {int(m.name.split("_")[1]): _best_score(read_rows(m / "stats.jsonl")) for m in members}
    return {index: score for index, score in scores.items() if score is not None}


def _prune_handed_checkpoints(tune_dir: Path) -> None:
    """Once the population is done: of the checkpoints Tune handed between members, each member's newest
    alone. (While it runs every one is kept: a member may copy another's checkpoint of some intervals
    ago, which a pruning meanwhile would have deleted under it.)"""
    for trial in tune_dir.glob("*/"):
        handed = sorted(trial.glob("checkpoint_*"))
        for old in handed[:-1]:
            shutil.rmtree(old, ignore_errors=True)


def _ray_actor_cpus(settings: Settings) -> float:
    """The CPUs a member's actors ask of Ray with runner=ray (0 where they are its own processes)."""
    runner = settings.runner
    return runner.n_actors * runner.num_cpus_per_actor if "num_cpus_per_actor" in runner else 0.0


def _member_needs(ray: Any, settings: Settings, ray_actors: float) -> dict[str, float]:
    """What each member asks of Ray for itself, so that the whole population runs at once. With Ray
    actors (runner=ray), one CPU for its learner: its actors ask for their own and go wherever the
    cluster has room; else a share of a node's CPUs, where its learner and actor processes run. With
    device=cuda, a share of the GPUs (Ray shows a process only the GPUs it asked for)."""
    population, nodes = settings.train.pbt.population, [n["Resources"] for n in ray.nodes() if n["Alive"]]
    cpus = sum(node.get("CPU", 0.0) for node in nodes)
    if ray_actors and cpus < population * (1 + ray_actors):
        raise ConfigError(f"pbt.population={population} with runner=ray needs {population} x (1 learner + "
                          f"{settings.runner.n_actors} actors x runner.num_cpus_per_actor={settings.runner.num_cpus_per_actor:g}) "
                          f"= {population * (1 + ray_actors):g} CPUs and the Ray cluster has {cpus:g}: lower runner.n_actors, "
                          f"runner.num_cpus_per_actor (e.g. 0.5) or pbt.population, or add nodes")
    needs = {"cpu": 1.0 if ray_actors else _share([node.get("CPU", 0.0) for node in nodes], population)}
    if settings.train.device.startswith("cuda"):
        gpus = sum(node.get("GPU", 0.0) for node in nodes)
        if not gpus:
            raise ConfigError(f"device={settings.train.device}: the Ray cluster of the population has no GPU; device=cpu, "
                              f"or start Ray on a machine with one")
        needs["gpu"] = min(1.0, gpus / population)
    return needs


def _share(node_cpus: list[float], members: int) -> float:
    """The most CPUs each of `members` can ask so that all of them fit on the nodes at once."""
    shares = sorted({cpus / k for cpus in node_cpus if cpus for k in range(1, members + 1)}, reverse=True)
    return next((share for share in shares if sum(math.floor(n / share + 1e-9) for n in node_cpus) >= members), 1.0)


def _member_resources(needs: dict[str, float], config: dict) -> dict:
    """What a member asks of Ray (`needs`), a hair less CPU for each member after the first. Tune
    hands a paused member's process (kept with reuse_actors) to the next member asking for the same
    resources; asking for amounts of its own, each member gets its own process back, where its run
    and its actors still are, rather than another member's to rebuild."""
    return {**needs, "cpu": needs["cpu"] - 1e-3 * config["index"]}


def _scheduler(pbt: Any, mutations: list[Mutation], run_dir: Path, seed: int = 0):
    """Ray Tune's PopulationBasedTraining (or PB2) over `mutations`, each exploit written to pbt.jsonl;
    PBT's explores drawn from `seed` (`Mutation.explore`), PB2's by its bandit."""
    from ray import tune
    from ray.tune.schedulers import PopulationBasedTraining

    by_key = {m.key: m for m in mutations}
    common = dict(time_attr="env_steps", metric="score", mode="max", perturbation_interval=pbt.interval_env_steps,
                  quantile_fraction=pbt.quantile_fraction, synch=pbt.synchronous, log_config=False)
    if pbt.scheduler == "pb2":
        try:
            from ray.tune.schedulers.pb2 import PB2
        except ImportError as err:
            raise ConfigError(f"pbt.scheduler=pb2 needs {err.name}: pip install scikit-learn GPy, or pbt.scheduler=pbt") from None
        return _recorded(PB2)(run_dir, by_key, pbt.copy_margin, hyperparam_bounds={k: [m.low, m.high] for k, m in by_key.items()},
                              **common)
    space = {k: tune.loguniform(m.low, m.high) if m.log_scale else tune.uniform(m.low, m.high) for k, m in by_key.items()}
    return _recorded(PopulationBasedTraining)(run_dir, by_key, pbt.copy_margin, random.Random(seed), hyperparam_mutations=space,
                                              resample_probability=pbt.resample_probability,
                                              **common)


def _recorded(scheduler: type) -> type:
    """`scheduler` that writes each exploit and explore into pbt.jsonl and says it in one line."""

    from ray.tune.experiment import Trial
    from ray.tune.schedulers import TrialScheduler

    class Recorded(scheduler):
        def __init__(self, run_dir: Path, mutations: dict[str, Mutation], copy_margin: float, rng: random.Random | None = None,
                     **options: Any):
            super().__init__(**options)
            self._run_dir, self._mutations, self._margin, self._rng = run_dir, mutations, copy_margin, rng
            self._errors: dict[Trial, float] = {}  # each member's latest score's standard error
            self._copied_at: dict[Trial, int] = {}  # the env steps of each member's latest copy

        def on_trial_result(self, tune_controller, trial, result):
            """As the scheduler decides, except that a member never pauses to let a waiting one run: the
            population is sized so that every member runs at once (Tune's asynchronous PBT pauses a
            member whenever another is pending, so that one exploit would stop and rebuild them all)."""
            self._errors[trial] = result.get("score_error", 0.0)
            decision = super().on_trial_result(tune_controller, trial, result)
            _say_result(trial, result, self._mutations)
            if decision == TrialScheduler.PAUSE and not self._synch and trial.status != Trial.PAUSED:
                return TrialScheduler.CONTINUE
            return decision

        def on_trial_error(self, tune_controller, trial):
            """Says that a member failed, and whether Tune starts it again from its last checkpoint. (Said
            here, not by a Tune callback: any callback makes Tune import every tracker it integrates,
            MLflow and W&B among them, to count them, seconds of the driver's start.)"""
            super().on_trial_error(tune_controller, trial)
            index, run_dir = trial.config["index"], trial.config["run_dir"]
            if trial.should_recover():
                log.warning(f"member {index} failed; started again from its last checkpoint (Ray Tune's error.txt under "
                            f"{run_dir}/tune says why)")
            else:
                log.warning(f"member {index} failed: see {run_dir}/member_{index}/train.log")

        def _quantiles(self):
            """Tune's quantiles, except that a member whose latest copy is under two intervals old is
            never at the bottom (the next lowest member is): its score at its first report after the
            copy is mostly the donor's weights, its explored values not yet shown, and copying it over
            then would end every explored line after one interval, leaving the population where it
            started when every member starts alike."""
            lower, upper = super()._quantiles()
            if not lower:
                return lower, upper
            ranked = sorted((t for t, state in self._trial_state.items() if t not in upper and state.last_score is not None
                             and not math.isnan(state.last_score) and not t.is_finished() and not self._settling(t)),
                            key=lambda t: self._trial_state[t].last_score)
            return ranked[:len(lower)], upper

        def _settling(self, trial) -> bool:
            """Whether `trial`'s latest copy is under two intervals before its latest report (a member
            reports a little past each multiple of the interval, hence 1.5)."""
            copied, result = self._copied_at.get(trial), self._trial_state[trial].last_result or {}
            return copied is not None and result.get("env_steps", copied) - copied < 1.5 * self._perturbation_interval

        def _checkpoint_or_exploit(self, trial, tune_controller, upper_quantile, lower_quantile):
            """A member at the bottom copies one at the top; every other member saves its checkpoint at
            each report. (The scheduler saves only a member that is at the top at its own report, so
            with members reporting one by one the member at the top when another reports had often
            no checkpoint to copy, and the copy was skipped.)"""
            donors = [top for top in upper_quantile if self._clearly_better(top, trial)] if trial in lower_quantile else []
            if donors:
                super()._checkpoint_or_exploit(trial, tune_controller, donors, lower_quantile)
            else:
                super()._checkpoint_or_exploit(trial, tune_controller, [trial], [])

        def _clearly_better(self, top, trial) -> bool:
            """Whether `top`'s score is above `trial`'s by more than `pbt.copy_margin` standard errors of
            their difference: a copy ends a member's line, which noise alone should not decide."""
            gap = self._trial_state[top].last_score - self._trial_state[trial].last_score
            return gap > self._margin * math.hypot(self._errors.get(top, 0.0), self._errors.get(trial, 0.0))

        def _get_new_config(self, trial, trial_to_clone):
            """The clone's explored values of the changed keys, and the member's own everything else
            (which member it is, its run dir): the scheduler copies the whole config otherwise."""
            if self._rng is None:  # PB2: its bandit's values
                explored, operations = super()._get_new_config(trial, trial_to_clone)
                return {**trial.config, **{key: explored[key] for key in self._mutations}}, operations
            explored = {key: m.explore(trial_to_clone.config[key], self._rng, self._resample_probability)
                        for key, m in self._mutations.items()}
            return {**trial.config, **explored}, {}

        def _exploit(self, tune_controller, trial, trial_to_clone):
            """The member copies `trial_to_clone`'s newest checkpoint and explores, in its own process at
            the start of its next interval (a copy order in its dir: maze_cli.cli.member), where the
            scheduler would pause it and start its process anew from the checkpoint: a copy costs a
            checkpoint's load, not a start of the member's run and actors."""
            state, donor = self._trial_state[trial], self._trial_state[trial_to_clone]
            before = {key: trial.config[key] for key in self._mutations}
            new_config, _ = self._get_new_config(trial, trial_to_clone)
            after = {key: new_config[key] for key in self._mutations}
            trial.set_config(new_config)
            journal.order_copy(member_dir(Path(trial.config["run_dir"]), trial.config["index"]), donor.last_checkpoint.path,
                               after, trial_to_clone.config["index"])
            self._num_perturbations += 1
            state.last_perturbation_time, state.last_train_time = donor.last_perturbation_time, donor.last_train_time
            row = {"env_steps": (state.last_result or {}).get("env_steps"), "member": trial.config["index"],
                   "copied": trial_to_clone.config["index"], "score": state.last_score, "copied_score": donor.last_score,
                   "before": before, "after": after}
            journal.record(self._run_dir, row)
            self._copied_at[trial] = row["env_steps"]
            log.info(f"pbt: member {row['member']} (score {row['score']:.2f}) copies member {row['copied']} "
                     f"(score {row['copied_score']:.2f}) at {row['env_steps']:,} env steps: {describe(after)}")

    return Recorded


def _say_result(trial: Any, result: dict, mutations: dict[str, Mutation]) -> None:
    """One console line per member per interval (Tune's own reporter is off)."""
    values = ", ".join(f"{m.name}={trial.config[m.key]:.4g}" for m in mutations.values())
    score = result.get("score")
    shown = "n/a" if score is None or math.isnan(score) else f"{score:.2f}"
    log.info(f"member {trial.config['index']}: {result['env_steps']:>10,} env steps, score {shown}, {values}")


def _summary(run_dir: Path, results: Any, start: dict[str, float], started: float) -> dict:
    """The best member (by its best evaluation, or its last training window without evaluation), its
    best.pt at the top, pbt.png, and the run's summary."""
    members = sorted(run_dir.glob("member_*"), key=lambda p: int(p.name.split("_")[1]))
    scored = _member_scores(members)
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
    failed = [r for r in results if r.error is not None]
    if failed:
        named = sorted(str(r.config["index"]) for r in failed if r.config)  # (Tune may keep no config of a failed member)
        which = f"member{'s' if len(named) > 1 else ''} {', '.join(named)}" if len(named) == len(failed) else f"{len(failed)} members"
        raise PopulationFailed(f"{which} failed: see {run_dir}/member_<i>/train.log and Ray Tune's error.txt under "
                               f"{run_dir / 'tune'}")
    return {"stop_reason": "pbt", "env_steps": None, "time_s": time.perf_counter() - started,
            "objective": scored[best] if best is not None else float("nan")}


def _best_score(rows: list[dict[str, Any]]) -> float | None:
    """A member's best: its best evaluation where it evaluated, else its last training window's mean."""
    evaluated = [row["eval/return_mean"] for row in rows if row.get("eval/return_mean") is not None]
    return max(evaluated) if evaluated else score_of(rows)
