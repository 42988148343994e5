"""The optimizer of every learner: torch's Adam, fused where the torch build has the kernel.

The first use of a torch.optim optimizer imports torch._dynamo (about 1 s on a small machine, as
much as importing torch). Learners therefore build theirs lazily, and `train` asks for them only
once the actors are starting, so the actors' start-up is not delayed; the learner's first update
still is (a CartPole run to 475 takes about 1.4 s longer as a whole process than with a hand-written
Adam; the training loop itself is as fast). Per step, torch's fused Adam costs about 50 us on a small
network (the kernel itself about 14 us), which SAC pays three times per update.
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
