"""Adam (Kingma & Ba 2015, Algorithm 1), written out.

torch.optim's optimizers import torch._dynamo on first use, which costs more start-up time than
importing torch itself (over a second on a small machine); a short run should not pay for a
compiler it never uses. The step runs torch's fused Adam kernel where the torch build has one for
the parameters' device (one kernel for all tensors: 4x faster than per-tensor ops on a small CPU
network, which matters to SAC's thousands of small updates), else the paper's update as a few
multi-tensor ops with the bias corrections folded into the step.
"""

from __future__ import annotations

import math
from typing import Iterable

import torch


class Adam:
    """m <- b1 m + (1-b1) g;  v <- b2 v + (1-b2) g^2;  p <- p - lr m_hat / (sqrt(v_hat) + eps)."""

    def __init__(self, params: Iterable[torch.nn.Parameter], lr: float, betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8):
        self.params = [p for p in params if p.requires_grad]
        self.lr, self.betas, self.eps = lr, betas, eps
        self.steps = 0
        self.exp_avg = [torch.zeros_like(p) for p in self.params]
        self.exp_avg_sq = [torch.zeros_like(p) for p in self.params]
        self.fused = hasattr(torch, "_fused_adam_")  # cleared on the first step if the kernel is missing for the device

    def zero_grad(self) -> None:
        for p in self.params:
            p.grad = None

    @torch.no_grad()
    def step(self) -> None:
        """One update of every parameter that has a gradient."""
        live = [(p, m, v) for p, m, v in zip(self.params, self.exp_avg, self.exp_avg_sq) if p.grad is not None]
        if not live:
            return
        params, m, v = (list(x) for x in zip(*live))
        grads = [p.grad for p in params]
        self.steps += 1
        if self.fused:
            try:
                self._fused_step(params, grads, m, v)
                return
            except (RuntimeError, NotImplementedError):  # no fused kernel for this device in this torch build
                self.fused = False
        self._foreach_step(params, grads, m, v)

    def _fused_step(self, params: list, grads: list, m: list, v: list) -> None:
        step = torch.tensor(float(self.steps), device=params[0].device)
        beta1, beta2 = self.betas
        torch._fused_adam_(params, grads, m, v, [], [step] * len(params), lr=self.lr, beta1=beta1, beta2=beta2,
                           weight_decay=0.0, eps=self.eps, amsgrad=False, maximize=False)

    def _foreach_step(self, params: list, grads: list, m: list, v: list) -> None:
        beta1, beta2 = self.betas
        bias1 = 1 - beta1**self.steps
        bias2 = 1 - beta2**self.steps
        torch._foreach_mul_(m, beta1)
        torch._foreach_add_(m, grads, alpha=1 - beta1)
        torch._foreach_mul_(v, beta2)
        torch._foreach_addcmul_(v, grads, grads, value=1 - beta2)
        denom = torch._foreach_sqrt(v)
        torch._foreach_div_(denom, math.sqrt(bias2))
        torch._foreach_add_(denom, self.eps)
        torch._foreach_addcdiv_(params, m, denom, value=-self.lr / bias1)

    def state_dict(self) -> dict:
        return {"steps": self.steps, "exp_avg": [t.clone() for t in self.exp_avg], "exp_avg_sq": [t.clone() for t in self.exp_avg_sq]}

    def load_state_dict(self, state: dict) -> None:
        self.steps = int(state["steps"])
        for mine, saved in zip(self.exp_avg + self.exp_avg_sq, state["exp_avg"] + state["exp_avg_sq"]):
            mine.copy_(saved)
