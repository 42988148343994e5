"""The learners' Adam: torch's fused kernel without torch.optim (whose first use imports torch._dynamo)."""

import subprocess
import sys

import pytest
import torch

from maze_cli.optim import Adam, adam


def train_both(ours: Adam, theirs: torch.optim.Optimizer, a: torch.nn.Module, b: torch.nn.Module, steps: int = 20) -> None:
    for _ in range(steps):
        x = torch.randn(8, 3)
        for model, opt in ((a, ours), (b, theirs)):
            opt.zero_grad()
            model(x).pow(2).sum().backward()
            opt.step()


@pytest.mark.parametrize("fused", [True, False])
def test_adam_steps_as_torchs_adam(fused):
    torch.manual_seed(0)
    ours, theirs = torch.nn.Linear(3, 2), torch.nn.Linear(3, 2)
    theirs.load_state_dict(ours.state_dict())
    opt_ours = adam(ours.parameters(), lr=0.01, eps=1e-5)
    opt_ours.fused = fused  # False: the _foreach form, as on a device without the fused kernel
    train_both(opt_ours, torch.optim.Adam(theirs.parameters(), lr=0.01, eps=1e-5, foreach=False), ours, theirs)
    for a, b in zip(ours.parameters(), theirs.parameters()):
        torch.testing.assert_close(a, b)


def test_adam_state_dict_is_torchs_format_both_ways():
    torch.manual_seed(0)
    ours, theirs = torch.nn.Linear(3, 2), torch.nn.Linear(3, 2)
    theirs.load_state_dict(ours.state_dict())
    opt_ours, opt_theirs = adam(ours.parameters(), lr=0.01), torch.optim.Adam(theirs.parameters(), lr=0.01, fused=True)
    train_both(opt_ours, opt_theirs, ours, theirs, steps=5)
    restored = adam(ours.parameters(), lr=0.5)
    restored.load_state_dict(opt_theirs.state_dict())  # torch's state into ours
    torch.optim.Adam(theirs.parameters(), lr=0.01).load_state_dict(opt_ours.state_dict())  # ours into torch's
    assert restored.param_groups[0]["lr"] == 0.01
    for i in range(2):
        for key in ("step", "exp_avg", "exp_avg_sq"):
            torch.testing.assert_close(restored.state_dict()["state"][i][key], opt_theirs.state_dict()["state"][i][key])


def test_a_state_of_other_parameters_is_refused():
    opt = adam(torch.nn.Linear(3, 2).parameters(), lr=0.01)
    other = adam(torch.nn.Linear(4, 2).parameters(), lr=0.01)
    other.params[0].grad = torch.ones(2, 4)
    other.step()
    with pytest.raises(ValueError, match="shape"):
        opt.load_state_dict(other.state_dict())


def test_adam_skips_frozen_parameters():
    model = torch.nn.Linear(2, 1)
    model.bias.requires_grad_(False)
    assert adam(model.parameters(), lr=0.1).params == [model.weight]


def test_building_and_stepping_adam_does_not_import_torch_dynamo():
    code = ("import sys, torch; from maze_cli.optim import adam; m = torch.nn.Linear(2, 1); o = adam(m.parameters(), 0.1); "
            "m(torch.ones(1, 2)).sum().backward(); torch.nn.utils.clip_grad_norm_(m.parameters(), 1.0); o.step(); "
            "print('torch._dynamo' in sys.modules)")
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip() == "False"
