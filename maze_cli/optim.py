"""The optimizer of every learner: Adam on torch's fused kernel, without torch.optim.

Building any torch.optim optimizer imports torch._dynamo (its methods are wrapped to disable
compilation): about as much CPU as importing torch itself, spent while the actors start on the same
cores, and a noticeable share of a CartPole run to its target (docs/benchmarks.md). This Adam
calls the same fused kernel torch's `Adam(fused=True)` calls (`torch._fused_adam_`: one kernel for
all tensors, several times faster than per-tensor ops on small networks, which matters to SAC's
thousands of small updates), so its steps are bit for bit torch's, and its state_dict has torch's
format (checkpoints of either load into the other).
Where a device has no fused kernel, the multi-tensor (`_foreach`) form of the same update runs.
"""

from __future__ import annotations

import functools
from typing import Any, Iterable

import torch


class Adam:
    """Adam (Kingma & Ba 2015), no weight decay, the interface the learners use: `param_groups`
    (lr may be changed there, as PPO's annealing does), `zero_grad()`, `step()`, `state_dict()`,
    `load_state_dict()`."""

    def __init__(self, params: Iterable[torch.nn.Parameter], lr: float, eps: float = 1e-8, betas: tuple[float, float] = (0.9, 0.999)):
        self.params = [p for p in params if p.requires_grad]
        self.fused = all(_has_fused_kernel(device) for device in {p.device for p in self.params})
        self.param_groups: list[dict[str, Any]] = [{
            "params": self.params, "lr": lr, "betas": tuple(betas), "eps": eps, "weight_decay": 0.0, "amsgrad": False,
            "maximize": False, "foreach": None, "capturable": False, "differentiable": False, "fused": self.fused,
            "decoupled_weight_decay": False,
        }]
        self.exp_avg = [torch.zeros_like(p, memory_format=torch.preserve_format) for p in self.params]
        self.exp_avg_sq = [torch.zeros_like(p, memory_format=torch.preserve_format) for p in self.params]
        self.steps = [torch.zeros((), dtype=torch.float32, device=p.device) for p in self.params]

    def zero_grad(self, set_to_none: bool = True) -> None:
        for p in self.params:
            p.grad = None

    @torch.no_grad()
    def step(self) -> None:
        group = self.param_groups[0]
        live = [i for i, p in enumerate(self.params) if p.grad is not None]
        if not live:
            return
        params = [self.params[i] for i in live]
        grads = [self.params[i].grad for i in live]
        exp_avg, exp_avg_sq, steps = ([xs[i] for i in live] for xs in (self.exp_avg, self.exp_avg_sq, self.steps))
        (beta1, beta2), lr, eps = group["betas"], group["lr"], group["eps"]
        torch._foreach_add_(steps, 1)
        if self.fused:
            torch._fused_adam_(params, grads, exp_avg, exp_avg_sq, [], steps, amsgrad=False, lr=lr, beta1=beta1, beta2=beta2,
                               weight_decay=0.0, eps=eps, maximize=False, grad_scale=None, found_inf=None)
            return
        torch._foreach_lerp_(exp_avg, grads, 1 - beta1)
        torch._foreach_mul_(exp_avg_sq, beta2)
        torch._foreach_addcmul_(exp_avg_sq, grads, grads, 1 - beta2)
        for p, m, v, t in zip(params, exp_avg, exp_avg_sq, steps):
            n = t.item()
            denom = (v.sqrt() / (1 - beta2 ** n) ** 0.5).add_(eps)
            p.addcdiv_(m, denom, value=-lr / (1 - beta1 ** n))

    def state_dict(self) -> dict[str, Any]:
        """torch.optim.Adam's format: per-parameter state by index, and the group's settings."""
        group = {k: v for k, v in self.param_groups[0].items() if k != "params"} | {"params": list(range(len(self.params)))}
        state = {i: {"step": s.clone(), "exp_avg": m.clone(), "exp_avg_sq": v.clone()}
                 for i, (s, m, v) in enumerate(zip(self.steps, self.exp_avg, self.exp_avg_sq)) if s.item() > 0}
        return {"state": state, "param_groups": [group]}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Our own or torch.optim.Adam's state; a different number or shape of parameters is a ValueError."""
        groups = state_dict["param_groups"]
        if len(groups) != 1 or len(groups[0]["params"]) != len(self.params):
            raise ValueError(f"the saved optimizer state is for {sum(len(g['params']) for g in groups)} parameters "
                             f"in {len(groups)} group(s); this one has {len(self.params)} in 1")
        saved = state_dict["state"]
        for i, p in enumerate(self.params):
            entry = saved.get(i, saved.get(str(i)))
            if entry is None:
                continue
            if entry["exp_avg"].shape != p.shape:
                raise ValueError(f"parameter {i} has shape {tuple(p.shape)}, its saved state {tuple(entry['exp_avg'].shape)}")
            self.steps[i].copy_(torch.as_tensor(entry["step"], dtype=torch.float32))
            self.exp_avg[i].copy_(entry["exp_avg"])
            self.exp_avg_sq[i].copy_(entry["exp_avg_sq"])
        for key in ("lr", "betas", "eps"):
            self.param_groups[0][key] = tuple(groups[0][key]) if key == "betas" else groups[0][key]


@functools.lru_cache(maxsize=None)
def _has_fused_kernel(device: torch.device) -> bool:
    """Whether torch has the fused Adam kernel for this device (CPU and CUDA in current torch);
    asked once per device and process."""
    try:
        p = torch.zeros(1, device=device)
        torch._fused_adam_([p], [p.clone()], [torch.zeros_like(p)], [torch.zeros_like(p)], [], [torch.ones((), device=device)],
                           amsgrad=False, lr=0.0, beta1=0.9, beta2=0.999, weight_decay=0.0, eps=1e-8, maximize=False)
        return True
    except (RuntimeError, NotImplementedError, AttributeError):
        return False


def adam(params: Iterable[torch.nn.Parameter], lr: float, eps: float = 1e-8) -> Adam:
    """The learners' optimizer (see the module's docstring for why it is not torch.optim.Adam)."""
    return Adam(params, lr=lr, eps=eps)
