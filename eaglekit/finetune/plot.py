"""A PNG of a fine-tune's loss and teacher-forced accuracy per draft depth over the steps."""

from __future__ import annotations

from collections.abc import Sequence

from eaglekit.errors import OutputError
from eaglekit.plotting import pyplot, save_figure


def plot_history(history: Sequence, path: str, *, title: str) -> str:
    """Write the two panels to `path` (atomically) and return its absolute path."""
    plt = pyplot()
    if not history:
        raise OutputError("no training steps were recorded, nothing to plot", path)
    steps = [r.step for r in history]
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    left.plot(steps, [r.loss for r in history], marker="o", markersize=3)
    left.set(xlabel="step", ylabel="loss (depth-weighted cross-entropy)", title="loss")
    for depth in range(len(history[0].accuracy)):
        right.plot(steps, [r.accuracy[depth] for r in history], marker="o", markersize=3, label=f"depth {depth}")
    right.set(xlabel="step", ylabel="top-1 accuracy (teacher-forced)", title="accuracy per draft depth", ylim=(0, 1))
    right.legend()
    fig.suptitle(title)
    fig.tight_layout()
    return save_figure(fig, path, dpi=110)
