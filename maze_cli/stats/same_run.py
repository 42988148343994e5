"""Are two runs one run? What `runner.reproducible=true` promises, checked on two run dirs.

Two runs are the same when every row of their stats.jsonl matches apart from what depends on timing,
and every tensor and number of their last.pt's learner state is equal.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterator

import torch

from maze_cli.stats.writers import read_rows

TIMING_KEYS = ("time_s", "sps", "queue_size", "actor_idle_frac")


def without_timings(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Rows without what depends on timing: times, speeds, and how full the queue or how idle the actors were."""
    return [{k: v for k, v in row.items() if k not in TIMING_KEYS and not k.startswith("time/") and not k.endswith("_s")}
            for row in rows]


def learner_state(run_dir: Path) -> torch.Tensor:
    """Every tensor and number of last.pt's learner state (weights, optimizer moments, counters),
    flattened in a fixed order; its seconds of training (`time_s`, what a time budget's schedule
    follows) left out, as the rows' times are."""
    saved = torch.load(Path(run_dir) / "checkpoints" / "last.pt", weights_only=True)
    return torch.cat(list(_flat({k: v for k, v in saved["learner"].items() if k != "time_s"})))


def _flat(tree: Any) -> Iterator[torch.Tensor]:
    if isinstance(tree, torch.Tensor):
        yield tree.double().flatten()
    elif isinstance(tree, (int, float)):
        yield torch.tensor([float(tree)], dtype=torch.float64)
    elif isinstance(tree, dict):
        for key in sorted(tree, key=str):
            yield from _flat(tree[key])
    elif isinstance(tree, (list, tuple)):
        for item in tree:
            yield from _flat(item)


def first_difference(a: Path, b: Path) -> str:
    """'same', or where two runs part: the first row and its keys that differ, or the weights."""
    ra, rb = (without_timings(read_rows(Path(run) / "stats.jsonl")) for run in (a, b))
    for i, (x, y) in enumerate(zip(ra, rb)):
        keys = sorted(k for k in set(x) | set(y) if x.get(k) != y.get(k))
        if keys:
            return f"row {i + 1}: {', '.join(keys[:3])}"
    if len(ra) != len(rb):
        return f"{len(ra)} rows against {len(rb)}"
    return "same" if torch.equal(learner_state(a), learner_state(b)) else "weights differ"
