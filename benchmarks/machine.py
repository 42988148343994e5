"""One line that says what a benchmark ran on."""

from __future__ import annotations

import os
import platform
import subprocess
from importlib import metadata
from pathlib import Path


def cpu_model() -> str:
    """The CPU's name and its widest vector units: machines of one name (a virtual "AMD EPYC") differ by
    2-3x in a CNN learner's speed between AVX2 and AVX-512, and bf16 pays only with AMX or on AMD's AVX512-BF16."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return platform.processor() or platform.machine()
    name = next((line.split(":", 1)[1].strip() for line in lines if line.startswith("model name")), platform.machine())
    flags = set(next((line.split(":", 1)[1].split() for line in lines if line.startswith("flags")), []))
    units = [label for flag, label in (("amx_tile", "AMX"), ("avx512_bf16", "AVX512-BF16"), ("avx512f", "AVX-512"),
                                       ("avx2", "AVX2")) if flag in flags]
    return f"{name}, {units[0]}" if units else name


def version(package: str) -> str:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return "not installed"


def gpu_name() -> str | None:
    """The first CUDA device's name, or None where torch sees none (torch is imported only here, on demand)."""
    try:
        import torch
    except ImportError:
        return None
    return torch.cuda.get_device_name(0) if torch.cuda.is_available() else None


def machine_line() -> str:
    gpu = gpu_name()
    return (f"{os.cpu_count()} cores ({cpu_model()}){f', {gpu}' if gpu else ''}, Python {platform.python_version()}, "
            f"torch {version('torch')}, gymnasium {version('gymnasium')}, ray {version('ray')}")


def commit() -> str:
    """The trainer's code that ran: the last commit that changed the package or its configs, where the
    benchmark runs from a checkout (a commit of benchmark figures or docs alone runs the same code, so
    runs on either side of it group together)."""
    out = subprocess.run(["git", "log", "-1", "--format=%h", "--", "maze_cli", "conf", "pyproject.toml"],
                         cwd=Path(__file__).resolve().parents[1], capture_output=True, text=True)
    return out.stdout.strip() if out.returncode == 0 else "unknown"
