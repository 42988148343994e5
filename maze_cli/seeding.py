"""One master seed derives every other seed of a run.

Each consumer (actor envs, actor agents, the learner, ...) draws from its own stream, keyed by a
purpose name, so adding a consumer never shifts the seeds of the others.
"""

from __future__ import annotations

import os
import random
import zlib

import numpy as np
import torch

_MAX_SEED = 2**31 - 1


def derive_seeds(master_seed: int, purpose: str, n: int) -> list[int]:
    """Return `n` seeds for `purpose`, a pure function of the master seed and the purpose name."""
    key = zlib.crc32(purpose.encode())
    state = np.random.SeedSequence([master_seed % 2**32, key]).generate_state(n, dtype=np.uint32)
    return [int(s) % _MAX_SEED for s in state]


def derive_seed(master_seed: int, purpose: str) -> int:
    """A single seed for `purpose`."""
    return derive_seeds(master_seed, purpose, 1)[0]


def seed_everything(seed: int) -> None:
    """Seed Python, NumPy and torch in the current process."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def deterministic_torch() -> None:
    """torch's deterministic algorithms, for reproducible mode: on the CPU its ops already are (with a fixed
    number of threads); on CUDA some are not (atomic adds in scatter and index_add, cuBLAS's split
    reductions), so torch picks deterministic ones and warns, naming the op, where it has none. cuBLAS needs
    a fixed workspace for it, set before CUDA starts."""
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.use_deterministic_algorithms(True, warn_only=True)
