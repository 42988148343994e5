"""One line that says what a benchmark ran on."""

from __future__ import annotations

import os
import platform
from importlib import metadata
from pathlib import Path


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def version(package: str) -> str:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return "not installed"


def machine_line() -> str:
    return (f"{os.cpu_count()} cores ({cpu_model()}), Python {platform.python_version()}, torch {version('torch')}, "
            f"gymnasium {version('gymnasium')}, ray {version('ray')}")
