"""How the learner's forward passes run on this machine: the precision `learner.precision=auto` becomes
(by the CPU's or GPU's bf16 arithmetic and the network's size), the checks of the learner options
before a run starts, and torch.compile with its compilations logged."""

from __future__ import annotations

import functools
import importlib.util
import logging
import os
import re
import shutil
import time
from pathlib import Path
from typing import Any, Callable, Mapping

import torch

from maze_cli.errors import ConfigError

log = logging.getLogger("maze_cli")

PRECISIONS = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}  # and "auto": see auto_precision
CUDA_GRAPH_MODES = ("reduce-overhead", "max-autotune")  # the modes that replay CUDA graphs on a GPU


def check_options(precision: str, compile: bool, device: str) -> None:
    """The learner options can run on this machine and device; else a ConfigError naming the key and
    the fix (before any actor starts)."""
    kind = torch.device(device).type
    if precision == "fp16" and kind != "cuda":
        raise ConfigError(f"learner.precision=fp16: fp16 training needs a CUDA device (device={device}); "
                          f"use learner.precision=bf16 (or fp32) on a CPU")
    if precision == "bf16" and kind == "cuda" and not torch.cuda.is_bf16_supported():
        raise ConfigError(f"learner.precision=bf16: this GPU ({torch.cuda.get_device_name()}) has no bf16; "
                          f"use learner.precision=fp16 or fp32")
    if compile:
        compiler = os.environ.get("CXX") or next((c for c in ("g++", "c++", "clang++") if shutil.which(c)), None)
        if compiler is None or not shutil.which(compiler):
            raise ConfigError("learner.compile=true: torch.compile needs a C++ compiler and none was found (CXX, g++, c++, "
                              "clang++); install one (e.g. apt install g++) or set learner.compile=false")
        if kind == "cuda" and importlib.util.find_spec("triton") is None:
            raise ConfigError("learner.compile=true: torch.compile on CUDA needs Triton (pip install triton, which CUDA builds "
                              "of torch bring); or set learner.compile=false")


GPU_BF16_MIN_PARAMETERS = 500_000  # below this a GPU's update is bound by kernel launches, not arithmetic


def auto_precision(device: torch.device, convolutional: bool, parameters: int = 0) -> str:
    """What `learner.precision=auto` becomes: bf16 for conv policies on a CPU that computes bf16 faster
    than fp32 (`bf16_pays_on_cpu`), and for conv policies of `GPU_BF16_MIN_PARAMETERS` or more on a GPU
    with bf16; fp32 elsewhere. Small networks gain nothing from bf16: on a GPU the update of a small net
    waits on kernel launches, to which autocast only adds its casts."""
    if device.type == "cuda":
        large = convolutional and parameters >= GPU_BF16_MIN_PARAMETERS
        return "bf16" if large and torch.cuda.is_bf16_supported() else "fp32"
    return "bf16" if convolutional and cpu_computes_bf16_faster() else "fp32"


def bf16_pays_on_cpu(cpuinfo: str) -> bool:
    """Whether a CPU, described by the text of /proc/cpuinfo, runs a conv learner faster in bf16 than in
    fp32: one with bf16 matrix units (AMX), or an AMD one with AVX512-BF16 (Zen 4 and later compute bf16
    dot products at full width). Without AMX an Intel CPU's AVX512-BF16 is slower than fp32, and a CPU
    without bf16 instructions only emulates it."""
    if re.search(r"\bamx_bf16\b", cpuinfo):
        return True
    return bool(re.search(r"\bavx512_bf16\b", cpuinfo)) and "AuthenticAMD" in cpuinfo


@functools.lru_cache(maxsize=None)
def cpu_computes_bf16_faster() -> bool:
    """`bf16_pays_on_cpu` for this machine's CPU (Linux's /proc/cpuinfo; elsewhere: no)."""
    try:
        return bf16_pays_on_cpu(Path("/proc/cpuinfo").read_text())
    except OSError:
        return False


class CompiledFunction:
    """A function compiled with torch.compile on its first call; compilations are logged (the first
    call's always; a later one's where torch's counters say a graph was added, as a batch of a new
    shape does).

    Under CUDA graphs (`cuda_graphs`) every call replays into the same output memory, so the next
    call would overwrite the tensors of this one that the learner still holds (its metrics, kept
    until the epoch's end): each call starts a new graph step and returns copies of its tensors."""

    def __init__(self, fn: Callable, name: str, mode: str, cuda_graphs: bool = False):
        self.fn, self.name, self.mode, self.cuda_graphs = fn, name, mode, cuda_graphs
        self.compiled: Callable | None = None

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        first = self.compiled is None
        if first:
            self.compiled = torch.compile(self.fn, mode=None if self.mode == "default" else self.mode, dynamic=False)
        graphs = _compiled_graphs()
        t0 = time.perf_counter()
        if self.cuda_graphs:
            torch.compiler.cudagraph_mark_step_begin()
        out = self.compiled(*args, **kwargs)
        if first or _compiled_graphs() != graphs:
            log.info(f"compiled {self.name} in {time.perf_counter() - t0:.1f} s (learner.compile=true)")
        return _copy_tensors(out) if self.cuda_graphs else out


def _copy_tensors(out: Any) -> Any:
    """`out` with each of its tensors (in dicts, tuples and lists) cloned; clone is differentiable,
    so the losses among them still backpropagate into the graph that made them."""
    if isinstance(out, torch.Tensor):
        return out.clone()
    if isinstance(out, Mapping):
        return {key: _copy_tensors(value) for key, value in out.items()}
    if isinstance(out, (tuple, list)):
        return type(out)(_copy_tensors(value) for value in out)
    return out


def _compiled_graphs() -> int | None:
    """How many graphs torch.compile has made in this process (None where torch does not say)."""
    try:
        from torch._dynamo.utils import counters
    except ImportError:  # a torch without this (private) counter: only first compilations are logged
        return None
    return counters["stats"]["unique_graphs"]


def grad_scaler(device: torch.device):
    """fp16's gradient scaler: small gradients would underflow in fp16 without it."""
    from torch.amp import GradScaler

    return GradScaler(device.type)
