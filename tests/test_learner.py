"""The shared learner (maze_cli/learner.py): every algorithm's update through it is numerically the
update each algorithm wrote for itself before, and its options behave as documented."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.learner_cases import CASES, run_case

GOLDEN = Path(__file__).parent / "data" / "learner_golden.pt"


def _update(learner, batch) -> dict:
    out = learner.update(batch)
    return out[0] if isinstance(out, tuple) else out


@pytest.mark.parametrize("case", sorted(CASES))
def test_each_update_in_fp32_equals_the_update_before_the_shared_learner(case):
    """Losses and metrics, every gradient of the last step and every parameter after it, against what
    each algorithm's own update produced on the same batch (tests/data/learner_golden.pt, written by
    the code before maze_cli.learner existed, from tests/learner_cases.py)."""
    golden = torch.load(GOLDEN, weights_only=True)[case]
    now = run_case(case, _update)
    assert sorted(now["stats"]) == sorted(golden["stats"])
    for key, value in golden["stats"].items():
        torch.testing.assert_close(now["stats"][key], value, rtol=1e-5, atol=1e-6, equal_nan=True, msg=f"{case}: {key}")
    for part in ("grads", "params"):
        assert sorted(now[part]) == sorted(golden[part]), f"{case}: {part} of other parameters"
        for name, value in golden[part].items():
            torch.testing.assert_close(now[part][name], value, rtol=1e-5, atol=1e-6, msg=f"{case}: {part} {name}")
