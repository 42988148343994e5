"""A member of a population: one ordinary maze_cli run in its own dir, which Ray Tune's PBT scheduler
drives one interval of env steps at a time (a `tune.Trainable`, in a Ray actor of its own)."""

from __future__ import annotations

import contextlib
import json
import logging
import os
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf
import ray
from ray import tune

from maze_cli.checkpoint import load_checkpoint, save_checkpoint
from maze_cli.cli.build import trusted_targets
from maze_cli.cli.resume import CHECKPOINTS, read_last_checkpoint
from maze_cli.cli.session import choose_policy_for_images, open_run, prepare_this_process
from maze_cli.cli.settings import register_configs, validate
from maze_cli.errors import MazeCliError
from maze_cli.pbt.journal import member_dir, score_error, score_of, take_copy_order
from maze_cli.pbt.mutations import apply_values, describe
from maze_cli.seeding import derive_seed
from maze_cli.stats.plots import draw_learning_curve
from maze_cli.stats.writers import read_rows
from maze_cli.training import PAUSED

log = logging.getLogger("maze_cli")
CHECKPOINT = "last.pt"  # a member's checkpoint in the dir Tune gives it
SCORE = "score.json"  # beside it: whose it is and how it scored


class Member(tune.Trainable):
    """`config`: the member's `index`, the population's `run_dir`, its composed config (`base`) and the
    current value of each key PBT changes (`algorithm.<key>`)."""

    def setup(self, config: dict[str, Any]) -> None:
        register_configs()  # (this process composed nothing: the schemas are what validation reads)
        self.index, self.keys = config["index"], [k for k in config if k.startswith("algorithm.")]
        self.dir = member_dir(Path(config["run_dir"]), self.index)
        if not (Path(config["run_dir"]) / "config.yaml").is_file():
            raise MazeCliError(f"pbt member {self.index} runs on node {ray.util.get_node_ip_address()}, where the population's run "
                               f"dir {config['run_dir']} is not: on a cluster, the run dir must be on storage every node sees "
                               f"(e.g. NFS: hydra.run.dir=/shared/...), as Ray Tune's own storage is (docs/scaling.md)")
        self.dir.mkdir(parents=True, exist_ok=True)
        _log_to(self.dir / "train.log")
        log.info(f"pbt member {self.index} on node {ray.util.get_node_ip_address()} ({ray.get_runtime_context().get_node_id()[:12]}), "
                 f"pid {os.getpid()}")
        cfg = OmegaConf.create(config["base"])
        # Members differ in their seeds, and so does each start of a member (Tune restarts a member to
        # copy another, and every interval when synchronous): its actors' episodes never repeat.
        self.rows_before = len(read_rows(self.dir / "stats.jsonl"))  # what an earlier start of it wrote
        cfg.seed = derive_seed(cfg.seed, f"pbt-member-{self.index}-after-{self.rows_before}-epochs")
        if config.get("resumed") and any((self.dir / "checkpoints" / name).is_file() for name in CHECKPOINTS):
            cfg.resume = str(self.dir)  # the population resumed: the member goes on from its own last.pt
        settings = validate(cfg, [])
        resumed_from = read_last_checkpoint(settings.train) if settings.train.resume else None
        env_factory, observation_space, action_space = prepare_this_process(settings)
        choose_policy_for_images(cfg, settings, observation_space)
        as_dict = OmegaConf.to_container(cfg, resolve=True)
        self.trusted = trusted_targets(as_dict)
        self.opened = open_run(cfg, settings, as_dict, env_factory, observation_space, action_space, self.trusted, resumed_from,
                               None, self.dir, console=False)
        self.interval, self.eval_episodes = settings.train.pbt.interval_env_steps, settings.train.eval.episodes
        self.window = settings.train.target_window
        self.ranked_by = settings.train.pbt.score
        self.closing = contextlib.ExitStack()
        self.closing.enter_context(self.opened.run.runner)
        self.closing.callback(lambda: [writer.close() for writer in self.opened.files])
        if resumed_from is not None:
            self.opened.run.runner.broadcast_updated_policy(self.opened.run.learner.policy.state_dict())
        apply_values(self.opened.run, {key: config[key] for key in self.keys})
        self.from_scratch = resumed_from is None  # until Tune restores a checkpoint into it

    def step(self) -> dict[str, Any]:
        """Train one interval: to the next multiple of `pbt.interval_env_steps`, or the budget's end."""
        if self.from_scratch and self.rows_before:  # started again with no checkpoint of its own: what it wrote goes
            for writer in self.opened.files:
                writer.rewind(0, 0)
        self.from_scratch = False
        order = take_copy_order(self.dir)
        if order is not None:  # the scheduler found this member at the bottom: copy and explore
            self.load_checkpoint(order["checkpoint"])
            self._take(order["values"])
        trainer = self.opened.trainer
        result = trainer.run(pause_at=(trainer.env_steps // self.interval + 1) * self.interval)
        done = result.stop_reason != PAUSED
        self.opened.checkpointer.save_last(trainer, result.stop_reason)  # what `train resume=<population>` goes on from
        if self.ranked_by == "train":
            self._evaluate_on_the_runs_cadence()
        if done:
            draw_learning_curve(self.dir)
        rows = read_rows(self.dir / "stats.jsonl")
        return {"env_steps": trainer.env_steps, "score": self._score(rows), "score_error": score_error(rows, self.eval_episodes, self.window, self.ranked_by),
                "best_eval": trainer.best_eval, "member": self.index, "stop_reason": result.stop_reason, "done": done}

    def _score(self, rows: list[dict[str, Any]] | None = None) -> float:
        score = score_of(read_rows(self.dir / "stats.jsonl") if rows is None else rows, self.ranked_by)
        return float("nan") if score is None else score  # (PBT leaves a member without a score out of its ranking)

    def _evaluate_on_the_runs_cadence(self) -> None:
        """With `pbt.score=train` no decision needs an evaluation: a schedule by epochs, which the epochs
        a member closes at each interval would make an evaluation per interval, goes by the env steps of
        the run's own epochs instead, as soon as its updates tell how many an update brings."""
        trainer = self.opened.trainer
        schedule, per_update = trainer.eval_schedule, trainer.update_env_steps
        if schedule.on and schedule.interval_env_steps is None and schedule.interval_s is None and per_update:
            schedule.interval_env_steps = max(1, round(schedule.interval * trainer.budget.epoch_length * per_update))

    def save_checkpoint(self, checkpoint_dir: str) -> str:
        """The member as it is now, for PBT to hand to a member that copies it: maze_cli's own checkpoint."""
        trainer = self.opened.trainer
        save_checkpoint(Path(checkpoint_dir) / CHECKPOINT, self.opened.checkpointer.payload(trainer, "pbt"))
        meta = {"member": self.index, "score": self._score(), "env_steps": trainer.env_steps}
        (Path(checkpoint_dir) / SCORE).write_text(json.dumps(meta), encoding="utf-8")
        return checkpoint_dir

    def load_checkpoint(self, checkpoint_dir: str) -> None:
        """Go on from a checkpoint, read as data; the actors get its weights before their next rollout.
        Another member's (a copy): its learner, that is weights, optimizers, normalizers and the counters
        its schedules follow, and its loop's state, while this member's own epochs and env steps go on,
        so that its rows and its budget stay its own. Its own (Tune starts a failed member again from
        it): everything, and the rows written after it are trained again."""
        run, trainer = self.opened.run, self.opened.trainer
        self.from_scratch = False
        state = load_checkpoint(Path(checkpoint_dir) / CHECKPOINT, where=f"pbt member {self.index}")
        meta = json.loads((Path(checkpoint_dir) / SCORE).read_text(encoding="utf-8"))
        run.learner.load_state_dict(state["learner"])
        run.loop.load_state_dict(state["loop"])
        run.runner.broadcast_updated_policy(run.learner.policy.state_dict())
        if meta["member"] != self.index:
            log.info(f"pbt: copied member {meta['member']} at {meta['env_steps']:,} env steps (score {meta['score']:.2f})")
            return
        trainer.load_state_dict(state["trainer"])
        for writer in self.opened.files:
            writer.rewind(trainer.epoch, trainer.env_steps)
        log.info(f"pbt: started again from its checkpoint at {trainer.env_steps:,} env steps")

    def reset_config(self, new_config: dict[str, Any]) -> bool:
        """The same member with explored values: they apply from the next update, no restart. Where Tune
        hands this process another member (it reuses a paused member's process), that member's run is
        opened here in its place (its checkpoint follows)."""
        if new_config["index"] != self.index:
            self.cleanup()
            self.setup(new_config)
            return True
        self._take({key: new_config[key] for key in self.keys})
        return True

    def _take(self, values: dict[str, float]) -> None:
        """Explored values, from the next update on."""
        apply_values(self.opened.run, values)
        log.info(f"pbt: {describe(values)}")

    def cleanup(self) -> None:
        self.closing.close()


def _log_to(path: Path) -> None:
    """maze_cli's log lines of this member into its train.log alone: the console shows the population's lines."""
    handler = logging.FileHandler(path, encoding="utf-8")
    handler.setFormatter(logging.Formatter("[%(asctime)s][%(levelname)s] - %(message)s"))
    logger = logging.getLogger("maze_cli")
    logger.handlers = [handler]
    logger.setLevel(logging.INFO)
    logger.propagate = False
