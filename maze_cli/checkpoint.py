"""Checkpoints: plain data, written atomically, read without running code from the file.

`last.pt` every `interval` epochs, at the end and on interruption; `best.pt` whenever the eval
return improves. Each holds the learner (policy, optimizers, counters), the trainer's and the loop's
counters, the RNG states, the resolved config, the policy's blueprint and, if asked, the replay buffer.

Checkpoints are what users share, so a checkpoint holds only tensors, numbers, strings, lists and
dicts, and is read with `torch.load(weights_only=True)`: reading one cannot run code. The policy it
asks for is built only from an allow-list (see maze_cli.policies.blueprint). Files are written to
a temp file beside the target and renamed, so a reader never sees a truncated one.
"""

from __future__ import annotations

import itertools
import os
import pickle
import random
import re
import uuid
import zipfile
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterable, Mapping

import numpy as np
import torch

from maze_cli.disk import writing
from maze_cli.distributed import SNAPSHOT
from maze_cli.errors import CheckpointError, CorruptCheckpoint, first_line

if TYPE_CHECKING:
    from maze_cli.evaluation import Snapshot
    from maze_cli.training import Trainer

FORMAT = "maze_cli.checkpoint"
VERSION = 3  # 1: the pickled format of maze_cli 0.1 (objects, not data); 2: plain data; 3: one learner layout
READABLE = (2, 3)  # format 2 is read as 3 (`upgraded_learner_state`)
_saves = itertools.count()  # a temp file name for each save of this process


def save_checkpoint(path: Path, payload: dict[str, Any], previous: Path | None = None) -> None:
    """Write `payload` to `path` so that a reader never sees a truncated file.

    Each save writes a temp file of its own name and renames it. An interrupt (Ctrl-C, SIGTERM)
    inside torch.save can leave torch's zip writer alive in the traceback, still holding its file;
    collected later, it writes its closing records there. With one temp name for every save, that
    file could be the one the next save (the checkpoint on the way out) renames to `path`; with a
    name per save it is an orphan, unlinked here, whatever is written to it.

    A full disk raises `DiskFull` naming `path` (torch's message has lost the errno: the filesystem,
    full at that moment, tells), and the temp file is removed, so `path` stays the last good
    checkpoint. (torch gets the path, not an open file: a writer left alive as above would write
    into a closed file when collected, and that aborts the process.) `previous`: where the file
    `path` held before goes, as the checkpoint to fall back on should `path` be found corrupt.
    """
    _write_atomically(path, lambda tmp: torch.save({"format": FORMAT, "version": VERSION, **payload}, tmp), previous)


def _write_atomically(path: Path, write: Callable[[Path], None], previous: Path | None = None) -> None:
    """`write` a temp file of its own beside `path`, then rename it to `path` (see save_checkpoint),
    the file it replaces renamed to `previous` first where given."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}-{next(_saves)}")
    try:
        with writing(path):
            path.parent.mkdir(parents=True, exist_ok=True)
            write(tmp)
            if previous is not None and path.is_file():
                os.replace(path, previous)
            os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def load_checkpoint(path: Path | str, trust: bool = False, where: str | None = None) -> dict[str, Any]:
    """The payload of a maze_cli checkpoint, read as plain data (or, with `trust`, as pickled
    objects: runs code from the file). Every way a file can be unusable is one CheckpointError."""
    path = Path(path)
    where = where or f"checkpoint={path}"
    if not path.is_file():
        raise CheckpointError(f"{where}: no such checkpoint file")
    with path.open("rb") as f:
        if f.read(4) != b"PK\x03\x04":  # torch's zip format (older raw pickles would run code to load)
            raise CorruptCheckpoint(f"{where}: not a maze_cli checkpoint (not a torch checkpoint file at all)")
    try:
        payload = torch.load(path, map_location="cpu", weights_only=not trust)
    except pickle.UnpicklingError as err:
        raise CheckpointError(_unsafe_message(path, where, err)) from None
    except Exception as err:  # noqa: BLE001 - torch raises RuntimeError, EOFError, ... for broken files
        raise CorruptCheckpoint(_unreadable_message(where, err)) from None
    if isinstance(payload, dict) and "format" not in payload and {"policy_blueprint", "learner"} <= set(payload):
        raise CheckpointError(f"{where}: written by maze_cli 0.1 (checkpoint format 1), which this version does not read; "
                              f"train again with this version")
    if not isinstance(payload, dict) or payload.get("format") != FORMAT:
        raise CheckpointError(f"{where}: not a maze_cli checkpoint (a torch file without maze_cli's format marker)")
    if payload.get("version") not in READABLE:
        raise CheckpointError(
            f"{where}: checkpoint format {payload.get('version')}, but this maze_cli reads formats "
            f"{', '.join(map(str, READABLE))}; use the maze_cli version that wrote it"
        )
    if isinstance(payload.get("learner"), dict):
        payload["learner"] = upgraded_learner_state(payload["learner"])
    payload["version"] = VERSION
    return payload


def upgraded_learner_state(state: Mapping[str, Any]) -> dict[str, Any]:
    """A learner state of checkpoint format 2 (each algorithm its own layout) in today's layout;
    today's is returned as it is."""
    if "modules" in state:
        return dict(state)
    if "optimizer" in state:  # IMPALA, APPO, PPO: one group, "policy"; the reward scaler's statistics
        extra = {"reward_scaler": state["reward_scaler"]} if "reward_scaler" in state else {}
        return {"policy": state["policy"], "modules": {}, "optimizers": {"policy": state["optimizer"]},
                "updates": state["updates"], "env_steps": state.get("env_steps", 0), "algorithm": extra}
    # SAC: critics, their targets and the temperature beside the policy
    return {"policy": state["policy"],
            "modules": {"critic": state["critic"], "critic_target": state["critic_target"],
                        "temperature": {"log_alpha": state["log_alpha"]}},
            "optimizers": state["optimizers"], "updates": state["updates"], "env_steps": 0, "algorithm": {}}



def _unreadable_message(where: str, err: Exception) -> str:
    return f"{where}: truncated or corrupt checkpoint ({type(err).__name__}: {first_line(err)})"


def _unsafe_message(path: Path, where: str, err: Exception) -> str:
    """A file that holds pickled objects: maze_cli 0.1's format, or something crafted."""
    if _looks_like_format_1(path):
        return (f"{where}: written by maze_cli 0.1 (checkpoint format 1: pickled objects), which this version does not "
                f"read (it would have to run code from the file); train again with this version")
    unsupported = re.search(r"Unsupported global: GLOBAL ([\w.]+)", str(err))
    what = f"it names {unsupported.group(1)}" if unsupported else "Python objects"
    return (f"{where}: the file holds objects whose loading would run code ({what}); refused. "
            f"If you trust the file's author: trust_checkpoint=true (runs code from the file)")


def _looks_like_format_1(path: Path) -> bool:
    """maze_cli 0.1 checkpoints carry these keys; read from the pickle's bytes, nothing executed."""
    try:
        with zipfile.ZipFile(path) as archive:
            name = next(n for n in archive.namelist() if n.endswith("data.pkl"))
            data = archive.read(name)
    except (zipfile.BadZipFile, StopIteration, OSError):
        return False
    return b"policy_blueprint" in data and b"learner" in data and FORMAT.encode() not in data


# -- RNG states as plain data -----------------------------------------------------------------------
def rng_states() -> dict[str, Any]:
    """torch's, numpy's and Python's global RNG states, as tensors and lists."""
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    return {
        "torch": torch.get_rng_state(),
        "numpy": {"kind": kind, "keys": torch.from_numpy(keys.astype(np.int64)), "pos": int(pos),
                  "has_gauss": int(has_gauss), "cached_gaussian": float(cached)},
        "python": _to_lists(random.getstate()),
    }


def set_rng_states(states: dict[str, Any]) -> None:
    torch.set_rng_state(states["torch"])
    n = states["numpy"]
    np.random.set_state((n["kind"], n["keys"].numpy().astype(np.uint32), n["pos"], n["has_gauss"], n["cached_gaussian"]))
    version, internal, gauss = states["python"]
    random.setstate((version, tuple(internal), gauss))


def _to_lists(value: Any) -> Any:
    return [_to_lists(v) for v in value] if isinstance(value, tuple) else value


# -- policies from checkpoints ----------------------------------------------------------------------
def load_policy(path: Path | str, trusted: Iterable[str] = (), trust: bool = False, where: str | None = None):
    """Rebuild the policy a checkpoint was trained with (allow-listed blueprint) and load its weights."""
    where = where or f"checkpoint={path}"
    return policy_from_payload(load_checkpoint(path, trust, where), trusted, trust, where)


def policy_from_payload(payload: dict[str, Any], trusted: Iterable[str] = (), trust: bool = False, where: str = "checkpoint"):
    """The policy of a loaded checkpoint, built from its blueprint (allow-listed) with its weights."""
    from maze_cli.policies.blueprint import build_policy

    try:
        blueprint, weights = payload["policy_blueprint"], payload["learner"]["policy"]
    except (KeyError, TypeError):
        raise CheckpointError(f"{where}: the checkpoint holds no policy (policy_blueprint and learner.policy)") from None
    policy = build_policy(blueprint, trusted, trust, where)
    try:
        policy.load_state_dict(weights)
    except RuntimeError as err:
        raise CheckpointError(f"{where}: its weights do not fit its policy blueprint ({first_line(err)})") from None
    return policy


ACTORS_FILE = "actors.pkl"
PREVIOUS = "previous.pt"  # the last.pt before the newest, what a resume falls back on if last.pt is found corrupt


def follower_state(run, with_replay_buffer: bool) -> dict[str, Any] | None:
    """A learner beside learner 0, at a checkpoint of a reproducible run: what it needs to go on as
    this run does after a resume: its actors' state, RNG states, loop state, replay buffer (when the
    run saves them) and its own learner state, which is learner 0's but for what each learner keeps
    of its own envs (the reward scaler's running return per env). None where its actors cannot be saved."""
    actors = run.runner.checkpoint_state()
    if actors is None:
        return None
    return {"actors": actors, "rng": rng_states(), "learner": run.learner.state_dict(), "loop": run.loop.state_dict(),
            **_replay_state(run, with_replay_buffer)}


def restore_follower_state(run, state: dict[str, Any]) -> None:
    """Before its actors start: a learner beside learner 0 goes on from its `follower_state`."""
    run.runner.restore_checkpoint_state(state["actors"])
    run.learner.load_state_dict(upgraded_learner_state(state["learner"]))
    run.loop.load_state_dict(state["loop"])
    _restore_replay_state(run, state)
    set_rng_states(state["rng"])


def _replay_state(run, with_replay_buffer: bool) -> dict[str, Any]:
    """The replay buffer's part of a checkpoint: its contents and the env steps its workers took."""
    buffer = run.runner.replay_buffer
    if not with_replay_buffer or buffer is None:
        return {}
    return {"replay_buffer": buffer.state_dict(), "worker_env_steps": run.runner.env_steps}


def _restore_replay_state(run, state: dict[str, Any]) -> None:
    buffer = run.runner.replay_buffer
    if buffer is not None and "replay_buffer" in state:
        buffer.load_state_dict(state["replay_buffer"])
        run.runner.env_steps = state["worker_env_steps"]


class Checkpointer:
    """Writes and restores the checkpoints of one run.

    With `actors_state` (a reproducible run), `last.pt` written at an epoch's end is paired with
    `actors.pkl` beside it: the actors' state (`DistributedActors.checkpoint_state`, their envs
    pickled) and, with several learners (`group`), each other learner's (`follower_state`), which
    `train resume=` reads so that the resumed run is the one that never stopped. That file is not a
    checkpoint to share: only resume reads it, from a run dir whose config.yaml already names the
    code that the run imports and builds."""

    def __init__(self, directory: Path, run, config: dict, interval: int, with_replay_buffer: bool,
                 actors_state: bool = False, group: Any = None):
        self.directory = directory
        self.run = run
        self.config = config
        self.interval = interval
        self.with_replay_buffer = with_replay_buffer
        self.actors_state = actors_state
        self.group = group
        self._actors_saved: tuple[str, int] | None = None  # (token, env steps) of the last actors.pkl written
        self._followers: tuple[int, list] | None = None  # (env steps, states) the other learners gave last
        self.followers_resume: list | None = None  # resume: the other learners' saved states, for them to restore
        self._last_saved_at: int | None = None  # the env steps of the last.pt this process wrote last

    def _at_interval(self, trainer: Trainer) -> bool:
        return trainer.epoch % self.interval == 0

    def take_followers_state(self, trainer: Trainer, reason: str | None) -> None:
        """Several learners, at an epoch's end that writes last.pt (its interval, or the run's end),
        before learner 0 tells the others to go on: each one's state for actors.pkl (`follower_state`)."""
        if self.actors_state and self.group is not None and (reason is not None or self._at_interval(trainer)):
            self.group.decide(SNAPSHOT)
            self._followers = (trainer.env_steps, self.group.gather_objects(None)[1:])

    def save_actors(self, env_steps: int) -> None:
        """Write actors.pkl for the last.pt about to be written at this step (once per step)."""
        if not self.actors_state or self._actors_token(env_steps) is not None:
            return
        state = self.run.runner.checkpoint_state()
        if state is not None and self.group is not None:
            followers = self._followers[1] if self._followers is not None and self._followers[0] == env_steps else None
            # a learner whose envs cannot be pickled said so itself
            state = None if followers is None or any(f is None for f in followers) else {**state, "learners": followers}
        if state is None:
            self._actors_saved = None
            return
        token = uuid.uuid4().hex
        data = pickle.dumps({"token": token, **state}, protocol=pickle.HIGHEST_PROTOCOL)
        _write_atomically(self.directory / ACTORS_FILE, lambda tmp: tmp.write_bytes(data))
        self._actors_saved = (token, env_steps)

    def _actors_token(self, env_steps: int) -> str | None:
        """The token of the actors.pkl written at this very step, if one was."""
        saved = self._actors_saved
        return saved[0] if saved is not None and saved[1] == env_steps else None

    def restore_actors(self, saved: dict[str, Any]) -> str | None:
        """Before the actors start: have them go on from the state `saved` (last.pt) was written with.
        Returns why they cannot (None when they will): no state saved (an interrupted run, an actor
        restarted, envs that cannot be pickled), actors.pkl another checkpoint's, or a replay buffer
        that was not saved."""
        if getattr(self.run.runner, "replay_buffer", None) is not None and "replay_buffer" not in saved:
            return "its replay buffer was not saved: checkpoint.replay_buffer=true saves it"
        token, path = saved.get("actors_token"), self.directory / ACTORS_FILE
        no_state = "the checkpoint holds no state of the actors: written on an interrupt, after an actor restarted, or with envs that cannot be pickled"
        if token is None or not path.is_file():
            return no_state
        try:
            state = pickle.loads(path.read_bytes())
        except Exception as err:
            return f"{ACTORS_FILE} cannot be read: {first_line(err)}"
        if not isinstance(state, dict) or state.get("token") != token:
            return f"{ACTORS_FILE} belongs to another checkpoint"
        followers = state.pop("learners", None)
        if self.group is not None:
            if followers is None or len(followers) != self.group.world_size - 1:
                return f"{ACTORS_FILE} does not hold the state of the other {self.group.world_size - 1} learner(s)"
            self.followers_resume = followers
        self.run.runner.restore_checkpoint_state(state)
        return None

    def payload(self, trainer: Trainer, reason: str) -> dict[str, Any]:
        return {
            "learner": self.run.learner.state_dict(),
            "trainer": trainer.state_dict(),
            "loop": self.run.loop.state_dict(),
            "policy_blueprint": self.run.blueprint,
            "rng": rng_states(),
            "config": self.config,
            "stop_reason": reason,
            **_replay_state(self.run, self.with_replay_buffer),
        }

    def save_last(self, trainer: Trainer, reason: str) -> None:
        payload = self.payload(trainer, reason)
        # Interrupted, the actors may be gone or mid-rollout: their state saved at this step (if any) is
        # not trusted to be the one the learner left.
        token = self._actors_token(trainer.env_steps)
        if token is not None and reason != "interrupted":
            payload["actors_token"] = token
        # the last.pt it replaces stays as previous.pt, unless it was written at this very step (the run's end
        # right after its epoch's checkpoint): previous.pt is then kept as what to fall back on
        rotated = trainer.env_steps != self._last_saved_at
        save_checkpoint(self.directory / "last.pt", payload, previous=self.directory / PREVIOUS if rotated else None)
        self._last_saved_at = trainer.env_steps

    def on_epoch_end(self, trainer: Trainer, stats: dict[str, Any]) -> None:
        # a snapshot's evaluation (eval.background) judged older weights: save_best_snapshot wrote those
        evaluated_now = "eval/return_mean" in stats and "eval/snapshot_env_steps" not in stats
        if evaluated_now and stats["eval/return_mean"] == stats["eval/best_return_mean"]:
            save_checkpoint(self.directory / "best.pt", self.payload(trainer, "best"))
        if self._at_interval(trainer):
            self.save_actors(trainer.env_steps)
            self.save_last(trainer, "running")

    def save_best_snapshot(self, trainer: Trainer, snapshot: Snapshot) -> None:
        """best.pt from the weights an evaluation in the background judged (a `maze_cli.evaluation.Snapshot`),
        not the learner's current ones; the rest of the payload is the run as it is now."""
        payload = self.payload(trainer, "best")
        payload["learner"] = {**payload["learner"], "policy": snapshot.policy.state_dict()}
        save_checkpoint(self.directory / "best.pt", payload)

    def restore(self, trainer: Trainer, state: dict[str, Any]) -> None:
        """Continue from `state`, the run's `last.pt` as load_checkpoint read it: learner, counters,
        RNG states and, if saved, the replay buffer."""
        self.run.learner.load_state_dict(state["learner"])
        trainer.load_state_dict(state["trainer"])
        if "loop" in state:  # (written since the loops keep state of their own)
            self.run.loop.load_state_dict(state["loop"])
        set_rng_states(state["rng"])
        _restore_replay_state(self.run, state)
