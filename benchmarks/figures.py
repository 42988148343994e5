"""What every benchmark's grid of learning curves shares: one legend below the panels, the axes named once."""

from __future__ import annotations

from pathlib import Path


def finish_grid(fig, axes, path: Path, ncol: int, bottom: float = 0.06) -> None:
    """A legend of every label drawn in `axes` (once each) below the grid, "env steps" and "eval return" on
    the figure's axes, written to `path`."""
    handles = {h.get_label(): h for ax in axes for h in ax.get_legend_handles_labels()[0]}
    fig.legend(handles.values(), handles.keys(), loc="lower center", ncol=min(len(handles), ncol), fontsize=8)
    fig.supxlabel("env steps", fontsize=8, y=bottom)
    fig.supylabel("eval return", fontsize=8)
    fig.tight_layout(rect=(0, bottom, 1, 1))
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
