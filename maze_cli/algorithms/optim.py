"""The optimizer of every learner: torch's Adam, fused where the torch build has the kernel.

Building a torch.optim optimizer imports torch._dynamo (about 1.7 s on a small machine, more than
importing torch). Learners therefore build theirs lazily (`LazyOptimizer`), and `train` asks for it
only once the actors are starting, so the import overlaps with actor start-up instead of delaying it.
"""

from __future__ import annotations

from typing import Iterable

import torch


def adam(params: Iterable[torch.nn.Parameter], lr: float, eps: float = 1e-8) -> torch.optim.Adam:
    """Adam (Kingma & Ba 2015) with torch's fused kernel where it exists for the parameters' device
    (one kernel for all tensors: several times faster than per-tensor ops on small networks, which
    matters to SAC's thousands of small updates), else torch's multi-tensor implementation."""
    params = [p for p in params if p.requires_grad]
    try:
        return torch.optim.Adam(params, lr=lr, eps=eps, fused=True)
    except (RuntimeError, TypeError):  # no fused kernel for this device or torch version
        return torch.optim.Adam(params, lr=lr, eps=eps, foreach=True)
