import pytest
import torch

from maze_cli.algorithms.optim import Adam


@pytest.mark.parametrize("fused", [True, False], ids=["fused-kernel", "multi-tensor"])
def test_adam_matches_torch_adam_step_for_step(fused):
    torch.manual_seed(0)
    ours, theirs = torch.nn.Linear(3, 2), torch.nn.Linear(3, 2)
    theirs.load_state_dict(ours.state_dict())
    opt_ours = Adam(ours.parameters(), lr=0.01, eps=1e-5)
    opt_ours.fused = fused
    opt_theirs = torch.optim.Adam(theirs.parameters(), lr=0.01, eps=1e-5)
    for _ in range(20):
        x = torch.randn(8, 3)
        for model, opt in ((ours, opt_ours), (theirs, opt_theirs)):
            opt.zero_grad()
            model(x).pow(2).sum().backward()
            opt.step()
    assert opt_ours.fused == fused  # this torch has the fused CPU kernel; the fallback path is what older ones run
    for a, b in zip(ours.parameters(), theirs.parameters()):
        torch.testing.assert_close(a, b)


def test_adam_state_round_trips():
    model = torch.nn.Linear(2, 1)
    opt = Adam(model.parameters(), lr=0.1)
    model(torch.ones(1, 2)).sum().backward()
    opt.step()
    restored = Adam(model.parameters(), lr=0.1)
    restored.load_state_dict(opt.state_dict())
    assert restored.steps == 1
    torch.testing.assert_close(restored.exp_avg_sq[0], opt.exp_avg_sq[0])
