"""The learners' Adam: torch's own, fused where the build has the kernel."""

import torch

from maze_cli.algorithms.optim import adam


def test_adam_takes_the_fused_kernel_where_the_build_has_one_and_matches_plain_adam():
    torch.manual_seed(0)
    ours, theirs = torch.nn.Linear(3, 2), torch.nn.Linear(3, 2)
    theirs.load_state_dict(ours.state_dict())
    opt_ours = adam(ours.parameters(), lr=0.01, eps=1e-5)
    opt_theirs = torch.optim.Adam(theirs.parameters(), lr=0.01, eps=1e-5, foreach=False)
    for _ in range(20):
        x = torch.randn(8, 3)
        for model, opt in ((ours, opt_ours), (theirs, opt_theirs)):
            opt.zero_grad()
            model(x).pow(2).sum().backward()
            opt.step()
    assert opt_ours.param_groups[0]["fused"]  # this torch has the fused CPU kernel
    for a, b in zip(ours.parameters(), theirs.parameters()):
        torch.testing.assert_close(a, b)


def test_adam_skips_frozen_parameters():
    model = torch.nn.Linear(2, 1)
    model.bias.requires_grad_(False)
    assert [p for group in adam(model.parameters(), lr=0.1).param_groups for p in group["params"]] == [model.weight]
