"""The body of one actor subprocess of `SubprocDistributedActors` (maze_cli.parallel.subproc): it takes
the slots the learner requests through its own pipe, fills them in shared memory with the newest
weights, and sends each slot's index back through its own pipe."""

from __future__ import annotations

import multiprocessing as mp
import time
import traceback

import torch
from torch import nn

from maze_cli.envs.mujoco import quiet_env_library_warnings
from maze_cli.envs.source import EnvSource
from maze_cli.parallel.actor_loop import Actor
from maze_cli.parallel.shared_memory import SharedTensors
from maze_cli.parallel.shared_weights import SharedWeights
from maze_cli.records import Rollout, RolloutSpec

POLL_S = 0.2  # how often a waiting actor looks whether the run stopped or the learner is gone


def _send(connection, message) -> bool:
    """Send to the learner over this actor's own pipe; False if the learner is gone."""
    try:
        connection.send(message)
        return True
    except (BrokenPipeError, EOFError, OSError):
        return False


def _get(connection, stopping) -> int | tuple[int, int] | None:
    """The next slot the learner requests (reproducible mode: with the policy version to fill it with);
    None once the run stops (`stopping`, a flag in shared memory read without a lock) or the learner is gone."""
    parent = mp.parent_process()
    while not stopping.value:
        try:
            if connection.poll(POLL_S):
                return connection.recv()
        except (EOFError, OSError):
            return None
        if parent is not None and not parent.is_alive():
            return None
    return None


def _snapshot_or_error(actor: Actor) -> bytes | str:
    """The actor's snapshot, or why it could not be taken (the learner says it once)."""
    try:
        return actor.snapshot()
    except Exception as err:
        return f"{type(err).__name__}: {err}"


def allocate_slots(spec: RolloutSpec, n_slots: int, memory) -> Rollout:
    """The pool of `n_slots` rollout records in `memory` (a function, so a child can map it again)."""
    return spec.allocate(n_slots=n_slots, memory=memory)


def actor_process(
    index: int,
    env_factory: EnvSource,
    policy: nn.Module,
    spec: RolloutSpec,
    slots: SharedTensors,
    requests,
    outbox,
    weights: list[SharedWeights],
    stopping,
    env_seed: int,
    agent_seed: int,
    initial_policy: nn.Module | None,
    generation: int,
    snapshot: bytes | None = None,
    run_envs: tuple[range, int] | None = None,
) -> None:
    """The body of one actor subprocess: take a requested slot from its own pipe, pull weights if
    newer, fill the slot, send its index back through its own pipe. `weights` is one buffer holding
    the newest version, or in reproducible mode a ring (version v in buffer v % len) from which each
    request names the version to act with. A request "snapshot" asks for the actor's state
    (`Actor.snapshot`), which a resumed run hands back as `snapshot`.

    `generation` counts the actor's restarts; its error report carries it, so that a report from a
    process the learner already replaced is not counted twice."""
    quiet_env_library_warnings()  # the learner's process shows them, once
    torch.set_num_threads(1)
    slots = slots.value  # the pool of rollout slots, mapped from /dev/shm or the learner's file
    actor = None
    slot = None  # the slot this actor holds, handed back with an error report
    try:
        actor = Actor(index, env_factory, policy, spec.n_envs, spec.n_steps, env_seed, agent_seed, initial_policy, snapshot, run_envs)
        while not stopping.value:
            t0 = time.perf_counter()
            request = _get(requests, stopping)
            if request is None:
                break
            if request == "snapshot":
                if not _send(outbox, ("snapshot", index, _snapshot_or_error(actor), generation)):
                    break
                continue
            wait = time.perf_counter() - t0
            slot, version = request if isinstance(request, tuple) else (request, None)
            # After taking the slot: an on-policy learner publishes before it hands out slots.
            if version is None and weights[0].version != actor.policy_version:
                actor.policy_version = weights[0].pull(actor.policy)
            elif version is not None and version != actor.policy_version:
                weights[version % len(weights)].pull(actor.policy)
                actor.policy_version = version
            info = actor.collect(slots.slot(slot))
            info.timings["actor_wait_s"] = wait
            if not _send(outbox, ("rollout", slot, info, generation)):
                break
            slot = None
    except KeyboardInterrupt:
        pass
    except Exception:
        _send(outbox, ("error", index, generation, slot, traceback.format_exc()))
    finally:
        if actor is not None:
            actor.close()
        outbox.close()
