"""Several learners in step: data-parallel training on torch.distributed.

`learner.num_learners=N` runs N learners, each with its own share of the actors and its own batches.
After every backward pass their gradients are averaged (one all-reduce per gradient step), so every
learner steps the same weights with the same gradient and holds identical weights after every
update: N learners on batches of B make the update one learner would make on the N*B batch (for
losses that average over equally many samples). Learner 0 (the `train` process) alone evaluates,
writes stats, TensorBoard, trackers and checkpoints; the others follow its decisions.

Every decision that ends or shapes a run is agreed, so that no learner is left waiting in a collective
for one that stopped: after each iteration the learners sum their env steps and learner 0 says
whether to go on, close the epoch (the others send it their episodes) or stop; a non-finite loss on
any learner stops all of them (`any`); PPO's KL stop and SAC's number of updates are agreed the same
way. A learner that dies breaks its connections, and the others' next collective fails at once; one
that hangs is given up after `learner.collective_timeout_s`. Either way a `LearnerFailure` names it.
"""

from __future__ import annotations

import datetime
import time
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import torch

from maze_cli.errors import MazeCliError, first_line

# What learner 0 says after each iteration (SNAPSHOT: after an epoch's end, "send me your state for a checkpoint").
CONTINUE, EPOCH_END, STOP, SNAPSHOT = 0, 1, 2, 3


class LearnerFailure(MazeCliError, RuntimeError):
    """A learner of a several-learner run died, raised or stopped answering; the message names it and why."""


@dataclass(frozen=True)
class GroupSpec:
    """How a learner joins its group (plain data: it travels to the other learners' processes)."""

    rank: int
    world_size: int
    host: str  # where learner 0's rendezvous store listens
    port: int
    timeout_s: float
    backend: str = "gloo"  # gloo on CPU, nccl on CUDA


def backend_for(device: str) -> str:
    return "nccl" if torch.device(device).type == "cuda" else "gloo"


class LearnerGroup:
    """This learner's place among the learners, and the collectives they make together.

    Every method is a collective: all learners call it in the same order. A collective that fails
    (a learner gone, the timeout passed) raises `LearnerFailure`; `explain` (given by whoever started
    the other learners) turns the error into the reason, naming the learner that failed; the
    rendezvous in the constructor is the first collective it explains.
    """

    def __init__(self, spec: GroupSpec, store: Any = None, explain: Callable[[Exception], str] | None = None):
        import torch.distributed as dist

        self.spec = spec
        self.rank, self.world_size = spec.rank, spec.world_size
        timeout = datetime.timedelta(seconds=spec.timeout_s)
        if store is None:
            store = dist.TCPStore(spec.host, spec.port, spec.world_size, is_master=False, timeout=timeout)
        self.explain = explain or self._default_explanation
        self._device = torch.device("cpu")
        if spec.rank > 0:
            _start_heartbeat(spec)
        try:
            dist.init_process_group(spec.backend, store=store, rank=spec.rank, world_size=spec.world_size, timeout=timeout)
        except Exception as err:  # noqa: BLE001 - a learner missing at the rendezvous
            raise LearnerFailure(f"learner {spec.rank} could not join the other learners: {self.explain(err)}") from None

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def use_device(self, device: torch.device) -> None:
        """Where this learner's collectives run (NCCL needs CUDA tensors; gloo takes CPU ones)."""
        self._device = device if self.spec.backend == "nccl" else torch.device("cpu")

    def _default_explanation(self, err: Exception) -> str:
        if self.rank != 0:
            return f"learner 0 (the train process) is gone ({first_line(err)})"
        return first_line(err)

    def _run(self, collective: Callable[[], Any]) -> Any:
        try:
            return collective()
        except LearnerFailure:
            raise
        except RuntimeError as err:  # gloo and NCCL report a lost peer or a timeout as RuntimeError (or a subclass)
            raise LearnerFailure(self.explain(err)) from None

    # -- the collectives ----------------------------------------------------------------------------
    def average_gradients(self, params: Sequence[torch.nn.Parameter], weight: torch.Tensor | None = None) -> None:
        """Replace each parameter's gradient by its mean over the learners, in one all-reduce (a
        parameter this learner's loss did not reach counts with a zero gradient). With `weight`
        (this learner's sample count), the mean is weighted by it: sum_i w_i g_i / sum_i w_i, the
        gradient of a loss averaged over every learner's samples when each g_i averages over w_i."""
        import torch.distributed as dist

        if not params:
            return
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
        flat = torch.cat([g.reshape(-1) for g in grads])
        if weight is not None:  # the weight travels in the same all-reduce, after the gradients
            w = weight.detach().to(flat.dtype).reshape(1)
            flat = torch.cat([flat * w, w])
        flat = flat.to(self._device)
        self._run(lambda: dist.all_reduce(flat))
        flat = flat.to(params[0].device)
        if weight is None:
            flat.div_(self.world_size)
        else:
            flat = flat[:-1] / flat[-1:].clamp(min=torch.finfo(flat.dtype).tiny)
        offset = 0
        for p, g in zip(params, grads):
            n = g.numel()
            p.grad = flat[offset:offset + n].view_as(g)
            offset += n

    def sum(self, values: Sequence[float]) -> list[float]:
        """Each value summed over the learners."""
        import torch.distributed as dist

        tensor = torch.tensor(list(values), dtype=torch.float64, device=self._device)
        self._run(lambda: dist.all_reduce(tensor))
        return tensor.tolist()

    def any(self, flag: bool) -> bool:
        """Whether `flag` holds on any learner."""
        return self.sum([float(flag)])[0] > 0

    def pooled_moments(self, mean: torch.Tensor, var: torch.Tensor, count: float) -> tuple[torch.Tensor, torch.Tensor, float]:
        """The mean, (population) variance and count of every learner's samples together, from each
        learner's own: what a running normalizer merges so that all learners keep the same statistics."""
        import torch.distributed as dist

        mean64, var64 = mean.detach().to(torch.float64).reshape(-1), var.detach().to(torch.float64).reshape(-1)
        packed = torch.cat([torch.tensor([count], dtype=torch.float64), count * mean64, count * (var64 + mean64.pow(2))])
        packed = packed.to(self._device)
        self._run(lambda: dist.all_reduce(packed))
        packed = packed.cpu()
        total = float(packed[0])
        n = mean64.numel()
        if total == 0:
            return mean, var, 0.0
        pooled_mean = packed[1:1 + n] / total
        pooled_var = (packed[1 + n:] / total - pooled_mean.pow(2)).clamp(min=0.0)
        return pooled_mean.view_as(mean), pooled_var.view_as(var), total

    def decide(self, code: int | None = None) -> int:
        """Learner 0's decision (CONTINUE, EPOCH_END, STOP or SNAPSHOT), sent to all: learner 0 passes it, the others receive it."""
        import torch.distributed as dist

        tensor = torch.tensor([code if self.is_main else -1], dtype=torch.int64, device=self._device)
        self._run(lambda: dist.broadcast(tensor, src=0))
        return int(tensor.item())

    def broadcast_object(self, obj: Any = None) -> Any:
        """Learner 0's `obj` (its learner state) on every learner. Pickled between our own processes only."""
        import torch.distributed as dist

        box = [obj if self.is_main else None]
        self._run(lambda: dist.broadcast_object_list(box, src=0, device=self._device if self.spec.backend == "nccl" else None))
        return box[0]

    def gather_objects(self, obj: Any) -> list[Any] | None:
        """Every learner's `obj`, in rank order, on learner 0 (None on the others)."""
        import torch.distributed as dist

        out = [None] * self.world_size if self.is_main else None
        self._run(lambda: dist.gather_object(obj, out, dst=0))
        return out

    def close(self) -> None:
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()


_HEARTBEAT = "maze_cli/heartbeat/"  # store keys: a count each learner beside learner 0 raises every second
_HEARTBEAT_S = 1.0


def _start_heartbeat(spec: GroupSpec) -> None:
    """Raise this learner's count in learner 0's store every second, from a thread with a connection
    of its own: a learner stopped (SIGSTOP) or frozen stops counting, one merely waiting in a
    collective goes on. The thread ends with the process, or when learner 0's store is gone."""
    import threading

    import torch.distributed as dist

    def beat() -> None:
        try:
            store = dist.TCPStore(spec.host, spec.port, is_master=False, timeout=datetime.timedelta(seconds=spec.timeout_s))
            while True:
                store.add(f"{_HEARTBEAT}{spec.rank}", 1)
                time.sleep(_HEARTBEAT_S)
        except Exception:  # noqa: BLE001 - learner 0 is gone: nothing left to tell
            return

    threading.Thread(target=beat, daemon=True, name="learner-heartbeat").start()


def silent_learners(store: Any, world_size: int, watch_s: float = 3 * _HEARTBEAT_S) -> list[int]:
    """The learners beside learner 0 whose heartbeat did not move in `watch_s`: alive, but not answering."""
    before = [store.add(f"{_HEARTBEAT}{rank}", 0) for rank in range(1, world_size)]
    time.sleep(watch_s)
    after = [store.add(f"{_HEARTBEAT}{rank}", 0) for rank in range(1, world_size)]
    return [rank for rank, (a, b) in enumerate(zip(before, after), start=1) if a == b]


def main_store(host: str, world_size: int, timeout_s: float):
    """Learner 0's rendezvous store on a free port of `host` (the others connect to it)."""
    import torch.distributed as dist

    return dist.TCPStore(host, 0, world_size, is_master=True, timeout=datetime.timedelta(seconds=timeout_s),
                         wait_for_workers=False)
