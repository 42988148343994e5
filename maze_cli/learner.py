"""The learner: what every algorithm's update has in common, written once.

An algorithm brings its losses (the math, beside the paper's equations) as an `Objective`
(maze_cli/contract.py): its modules, its optimizer groups and the steps of a batch, each
a set of named losses with metrics. The `Learner` owns everything else an update does:

- the optimizers and their state, one per named group of parameters (IMPALA and PPO: one; SAC:
  critics, actor and temperature), and gradient clipping per group;
- precision: the forward pass under autocast (bf16 on CPU and CUDA, fp16 on CUDA with a gradient
  scaler); what the loss math is computed in stays the algorithm's choice (they cast network
  outputs to fp32, so V-trace and GAE never run in 8 bits of mantissa);
- compilation: a loss function compiled once with torch.compile (shapes are fixed by the config,
  so one graph serves every batch), the time it took in the log;
- the device, the timings of forward and backward passes, and the metrics: kept as tensors and
  reduced once per epoch, so no minibatch waits for the host to read a number back. The one sync
  left is a finiteness check of the iteration's losses before its weights are published;
- with several learners (`learner.num_learners`), the averaging of every gradient over them
  (maze_cli/distributed.py), so that an algorithm's update is the same code for one learner or N;
- the update itself: the lr schedule, the steps an objective asks for, the counters of updates and
  consumed env steps, and the learner's state in checkpoints, in one format for every algorithm.
"""

from __future__ import annotations

import contextlib
import logging
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Mapping

import torch
from torch import nn

from maze_cli.contract import Objective, Step, UpdateContext
from maze_cli.distributed import LearnerGroup
from maze_cli.errors import NonFiniteLoss
from maze_cli.optim import Adam
from maze_cli.precision import CUDA_GRAPH_MODES, PRECISIONS, CompiledFunction, auto_precision, grad_scaler
from maze_cli.stats.aggregator import EpochStatsAggregator

log = logging.getLogger("maze_cli")

MIN_LR_SCALE = 0.01  # how far an adaptive lr (OptimizerGroup.adaptive_kl) may fall below its configured value


@dataclass
class ParameterGroup:
    """One optimizer and the parameters it steps; `max_grad_norm` clips their joint gradient norm, or
    that of each of `clip_parts` on its own."""

    optimizer: Adam
    params: list[nn.Parameter]
    max_grad_norm: float | None = None
    loss: str = "loss"  # the name of its loss among the metrics
    lr: float = 0.0  # the lr the schedule starts from
    anneal: bool = False  # the lr falls linearly to 0 over the run's budget
    adaptive_kl: float | None = None  # the approx_kl each batch aims at (OptimizerGroup.adaptive_kl)
    lr_scale: float = 1.0  # where the adaptive schedule has brought the lr, as a fraction of `lr`
    clip_parts: list[list[nn.Parameter]] | None = None  # clipped each on its own (None: all together)

    def clip_gradients(self) -> torch.Tensor:
        """Clip the gradients to `max_grad_norm`; returns their joint norm before clipping."""
        if self.clip_parts is None:
            return nn.utils.clip_grad_norm_(self.params, self.max_grad_norm)
        return torch.stack([nn.utils.clip_grad_norm_(part, self.max_grad_norm) for part in self.clip_parts]).norm()


class Learner:
    """Runs an algorithm's `Objective`: optimizers, schedules, counters, precision, compilation,
    device, timings, metrics and checkpoint state of one learner.

    :param objective: the algorithm's update (None: a learner whose groups and losses are added by hand).
    :param device: where the learner's modules live and its batches are moved to.
    :param precision: fp32, bf16 (autocast; CPU and CUDA) or fp16 (autocast and a gradient scaler; CUDA).
    :param compile: compile the objective's loss functions (its `compiled` methods).
    :param compile_mode: torch.compile's mode (default, reduce-overhead: CUDA graphs, max-autotune).
    :param group: this learner's place among several data-parallel learners (None: the only learner).
    :param max_env_steps: the run's budget of env steps, over which annealed lrs fall to 0.
    :param max_time_s: the run's budget of seconds (None: none). Where it is set, a schedule follows
        whichever of the two budgets is nearer its end, so that an annealed lr reaches 0 when the run
        stops on time (a run on a time budget alone sets a large max_env_steps).
    """

    def __init__(self, objective: Objective | None = None, device: str | torch.device = "cpu", precision: str = "fp32",
                 compile: bool = False, compile_mode: str = "default", group: LearnerGroup | None = None,
                 max_env_steps: int | None = None, max_time_s: float | None = None):
        if precision not in PRECISIONS and precision != "auto":
            raise ValueError(f"precision={precision}: must be auto or one of {', '.join(PRECISIONS)}")
        self.device = torch.device(device)
        self.precision = precision
        self.compile = compile
        self.compile_mode = compile_mode
        self.groups: dict[str, ParameterGroup] = {}
        self.scaler = grad_scaler(self.device) if precision == "fp16" else None
        self.metrics = EpochStatsAggregator()  # learner/* (tensors until the epoch's row is made) and time/*
        self.timings = {"forward": 0.0, "backward": 0.0}  # seconds since `take_timings`
        self._watched: list[tuple[str, torch.Tensor]] = []  # losses of this iteration, checked before a broadcast
        self.group = group
        if group is not None:
            group.use_device(self.device)
        self.max_env_steps = max_env_steps
        self.max_time_s = max_time_s
        self._time_before = 0.0  # seconds of updating in the sessions before this one (resume)
        self._first_update_at: float | None = None
        self.updates = 0  # updates made (what `Step.ends_update` marks)
        self.env_steps = 0  # env steps consumed by every learner together, for the schedules
        self.objective = objective
        if objective is not None:
            self._take(objective)

    def _take(self, objective: Objective) -> None:
        """Move the objective's modules here, build its optimizers, wrap its loss functions."""
        for module in objective.modules().values():
            module.to(self.device)
        for name, spec in objective.optimizer_groups().items():
            self.add_optimizer(name, spec.params, spec.lr, spec.eps, spec.max_grad_norm, spec.clip_parts)
            group = self.groups[name]
            group.loss, group.anneal, group.adaptive_kl = spec.loss, spec.anneal, spec.adaptive_kl
        for name in objective.compiled:
            setattr(objective, name, self.loss_function(getattr(objective, name), f"{objective.title} ({name})"))

    def follow_optimizer_settings(self) -> None:
        """Take the objective's optimizer settings (lr, Adam's eps, gradient clipping) as its config
        holds them now: a key changed mid-run (population-based training) applies from the next update."""
        for name, spec in self.objective.optimizer_groups().items():
            group = self.groups[name]
            group.lr, group.max_grad_norm = spec.lr, spec.max_grad_norm
            group.optimizer.param_groups[0]["eps"] = spec.eps

    @property
    def policy(self) -> nn.Module:
        """The policy the actors act with (the objective's)."""
        return self.objective.policy

    @property
    def pool(self):
        """How running statistics (observation normalizer, reward scale) pool every learner's samples; None alone."""
        return None if self.group is None else self.group.pooled_moments

    @property
    def world_size(self) -> int:
        """How many learners train together (each on its own batches)."""
        return 1 if self.group is None else self.group.world_size

    @property
    def time_s(self) -> float:
        """Seconds since this learner's first update, those of earlier sessions included: the clock
        of a time budget (startup is not charged, as the trainer does not charge it either)."""
        if self._first_update_at is None:
            return self._time_before
        return self._time_before + time.perf_counter() - self._first_update_at

    def progress_left(self) -> float:
        """1 at the start of the budget, 0 at its end (what an annealed lr, and PPO's clip, are scaled by):
        of the env steps' and the seconds' budgets, the one nearer its end."""
        spent = self.env_steps / self.max_env_steps if self.max_env_steps else 0.0
        if self.max_time_s:
            spent = max(spent, self.time_s / self.max_time_s)
        return max(0.0, 1.0 - spent)

    # -- an update ----------------------------------------------------------------------------------
    def update(self, batch: Any) -> dict[str, Any]:
        """The objective's steps on one batch, counted, checked and recorded; returns the batch's
        metrics (tensors, also recorded for the epoch's row)."""
        if self._first_update_at is None:
            self._first_update_at = time.perf_counter()
        self._schedule_lr()
        context = self.context()
        steps = [self._take_step(step) for step in self.objective.steps(batch, context)]
        self.env_steps += self.objective.env_steps(batch) * self.world_size
        summary = self.objective.summary(batch, steps, context)
        self._adapt_lr(summary)
        self.record(summary)
        return summary

    def context(self) -> UpdateContext:
        """What the objective's next call reads of this learner (`UpdateContext`)."""
        return UpdateContext(self.device, self.updates, self.env_steps, self.progress_left(),
                             {name: g.optimizer.param_groups[0]["lr"] for name, g in self.groups.items()},
                             self.autocast, self.group)

    def _take_step(self, step: Step) -> dict[str, Any]:
        self.timings["forward"] += step.forward_s
        norms = self.step(step.losses, step.samples)
        self.watch({self.groups[name].loss: loss for name, loss in step.losses.items()})
        metrics = dict(step.metrics)
        for name, norm in norms.items():
            metrics["grad_norm" if len(norms) == 1 else f"grad_norm/{name}"] = norm
        if step.ends_update:
            self.updates += 1
            self.objective.after_update(self.context())
        return metrics

    def _schedule_lr(self) -> None:
        """The lr of the next gradient steps: each group's configured lr (also after an optimizer state
        from a checkpoint brought its own) times its `lr_scale`, falling linearly to 0 over the budget
        where it anneals."""
        for group in self.groups.values():
            lr = group.lr * group.lr_scale
            group.optimizer.param_groups[0]["lr"] = lr * self.progress_left() if group.anneal else lr

    def _adapt_lr(self, summary: Mapping[str, Any]) -> None:
        """The adaptive groups' lr for the next batch, from this batch's approx_kl (rl_games' schedule: a
        Gaussian whose std shrinks moves further with each step of the same lr). Several learners move
        together: down where any passed the bound, up only where all stayed under it."""
        for group in self.groups.values():
            if group.adaptive_kl is None:
                continue
            kl = float(summary["approx_kl"])
            high, low = kl > 2.0 * group.adaptive_kl, kl < 0.5 * group.adaptive_kl
            if self.group is not None:
                high, low = self.group.any(high), not self.group.any(not low)
            if high:
                group.lr_scale = max(group.lr_scale / 1.5, MIN_LR_SCALE)
            elif low:
                group.lr_scale = min(group.lr_scale * 1.5, 1.0)

    # -- setting up ---------------------------------------------------------------------------------
    def add_optimizer(self, name: str, params: Iterable[nn.Parameter], lr: float, eps: float = 1e-8,
                      max_grad_norm: float | None = None, clip_parts: list[list[nn.Parameter]] | None = None) -> Adam:
        """Adam over `params`, stepped by `step({name: loss})`."""
        params = [p for p in params if p.requires_grad]
        optimizer = Adam(params, lr=lr, eps=eps)
        parts = None if clip_parts is None else [[p for p in part if p.requires_grad] for part in clip_parts]
        self.groups[name] = ParameterGroup(optimizer, params, max_grad_norm, lr=lr, clip_parts=parts)
        return optimizer

    def loss_function(self, fn: Callable, name: str) -> Callable:
        """`fn` as the learner runs it: under autocast at this learner's precision, compiled if asked.
        The first call of a compiled function compiles it; that call and any later recompilation
        (a batch of a new shape) are logged with the seconds they took."""
        cuda_graphs = self.device.type == "cuda" and self.compile_mode in CUDA_GRAPH_MODES
        run = fn if not self.compile else CompiledFunction(fn, name, self.compile_mode, cuda_graphs)

        def forward(*args: Any, **kwargs: Any) -> Any:
            t0 = time.perf_counter()
            with self.autocast():
                out = run(*args, **kwargs)
            self.timings["forward"] += time.perf_counter() - t0
            return out

        return forward

    def autocast(self) -> contextlib.AbstractContextManager:
        """The context of every forward pass: autocast to bf16 / fp16, or nothing for fp32."""
        if self.precision == "auto":  # decided on first use, when the parameters are known
            # conv kernels are the parameters with 4 dims or more ([out, in, h, w])
            params = [p for group in self.groups.values() for p in group.params]
            convolutional = any(p.dim() >= 4 for p in params)
            parameters = sum(p.numel() for p in params)
            self.precision = auto_precision(self.device, convolutional, parameters)
            log.info(f"learner.precision=auto: {self.precision} ({'conv' if convolutional else 'no conv'} layers, "
                     f"{parameters:,} parameters, on {self.device.type})")
        dtype = PRECISIONS[self.precision]
        if dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.device.type, dtype=dtype)

    # -- one gradient step --------------------------------------------------------------------------
    def step(self, losses: Mapping[str, torch.Tensor], samples: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
        """Backpropagate each loss into its own group's parameters (named as in `add_optimizer`),
        clip, and step each group's optimizer; returns the gradient norm (before clipping) of every
        group that clips. Gradients of one loss never reach another group's parameters.

        With several learners, the gradients are averaged over them before anything else looks at
        them (still scaled, under fp16: an overflow on one learner then skips the step on all).
        `samples`: how many samples the losses average over on this learner, where that differs
        between learners (steps of autoreset left out): the average is then weighted by it, which
        gives the gradient of the losses averaged over every learner's samples at once."""
        t0 = time.perf_counter()
        names = list(losses)
        for name in names:
            self.groups[name].optimizer.zero_grad()
        for i, name in enumerate(names):
            loss = losses[name] if self.scaler is None else self.scaler.scale(losses[name])
            torch.autograd.backward(loss, inputs=self.groups[name].params, retain_graph=i < len(names) - 1)
        if self.group is not None:
            self.group.average_gradients([p for name in names for p in self.groups[name].params], samples)
        norms = {}
        for name in names:
            group = self.groups[name]
            if self.scaler is not None:
                self.scaler.unscale_(group.optimizer)
            if group.max_grad_norm is not None:
                norms[name] = group.clip_gradients()
            if self.scaler is not None:
                self.scaler.step(group.optimizer)
            else:
                group.optimizer.step()
        if self.scaler is not None:
            self.scaler.update()
        self.timings["backward"] += time.perf_counter() - t0
        return norms

    # -- metrics and checks -------------------------------------------------------------------------
    def record(self, metrics: Mapping[str, torch.Tensor | float], prefix: str = "learner/") -> None:
        """Keep an update's metrics for the epoch's row (tensors stay on their device until then)."""
        for key, value in metrics.items():
            self.metrics.add(f"{prefix}{key}", value.detach() if isinstance(value, torch.Tensor) else value)

    def watch(self, losses: Mapping[str, torch.Tensor]) -> None:
        """Losses whose finiteness `check_finite` asserts before the iteration's weights leave."""
        self._watched += [(name, loss.detach()) for name, loss in losses.items()]

    def check_finite(self) -> None:
        """Raise NonFiniteLoss naming the first watched loss that is NaN or infinite (one host sync
        for all of them), so that no diverged weights reach an actor or a checkpoint. With several
        learners all of them raise when any one has a non-finite loss."""
        watched, self._watched = self._watched, []
        bad = None
        if watched:
            finite = torch.stack([loss.float() for _, loss in watched]).isfinite()
            if not bool(finite.all()):
                bad = watched[int((~finite).nonzero()[0])]
        if self.group is not None and self.group.any(bad is not None) and bad is None:
            raise NonFiniteLoss("learner/loss (on another learner)", float("nan"))
        if bad is not None:
            raise NonFiniteLoss(f"learner/{bad[0]}", float(bad[1]))

    def record_timings(self, **seconds: float) -> None:
        """An iteration's timings (`time/<name>`) and this learner's forward and backward seconds in it."""
        for name, value in seconds.items():
            self.metrics.add(f"time/{name}", value)
        timings = self.take_timings()
        self.metrics.add("time/learner_forward_s", timings["forward"])
        self.metrics.add("time/learner_backward_s", timings["backward"])

    def take_timings(self) -> dict[str, float]:
        """Seconds of forward and backward passes since the last call."""
        timings, self.timings = self.timings, {"forward": 0.0, "backward": 0.0}
        return timings

    # -- checkpoints --------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """Every algorithm's learner state in one format: the policy's weights, the other modules',
        each optimizer group's Adam, the counters and the objective's own state."""
        modules = self.objective.modules()
        return {
            "policy": modules["policy"].state_dict(),
            "modules": {name: module.state_dict() for name, module in modules.items() if name != "policy"},
            "optimizers": self.optimizer_state(),
            "updates": self.updates,
            "env_steps": self.env_steps,
            "time_s": self.time_s,
            "lr_scales": {name: group.lr_scale for name, group in self.groups.items()},
            "algorithm": self.objective.extra_state(),
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Go on from `state` (resume): everything `state_dict` holds."""
        self.policy.load_state_dict(state["policy"])
        self.load_training_state(state)
        self.updates = state["updates"]
        self.env_steps = state["env_steps"]
        self._time_before, self._first_update_at = state.get("time_s", 0.0), None  # absent from older checkpoints
        for name, scale in state.get("lr_scales", {}).items():
            self.groups[name].lr_scale = scale
        self.objective.load_extra_state(state["algorithm"])

    def load_training_state(self, state: Mapping[str, Any]) -> None:
        """What the optimizers' state belongs to: the modules besides the policy (critics, their
        targets) and the optimizers (resume, and warm start with `init_from.optimizer=true`)."""
        modules = self.objective.modules()
        for name, saved in state["modules"].items():
            modules[name].load_state_dict(saved)
        self.load_optimizer_state(state["optimizers"])

    def load_normalizer_state(self, state: Mapping[str, Any]) -> None:
        """Warm start with `init_from.normalizer=true`: the objective's statistics (the reward scale)."""
        self.objective.load_normalizer_state(state["algorithm"])

    def optimizer_state(self) -> dict[str, Any]:
        return {name: group.optimizer.state_dict() for name, group in self.groups.items()}

    def load_optimizer_state(self, state: Mapping[str, Any]) -> None:
        for name, saved in state.items():
            self.groups[name].optimizer.load_state_dict(saved)
