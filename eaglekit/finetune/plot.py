"""A PNG of a fine-tune's loss and teacher-forced accuracy per draft depth over the steps."""

from __future__ import annotations

import os
from collections.abc import Sequence

from eaglekit.errors import OutputError, UsageError


def plot_history(history: Sequence, path: str, *, title: str) -> str:
    """Write the two panels to `path` (atomically) and return its absolute path."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise UsageError("--plot needs matplotlib: pip install 'eaglekit[plot]'") from None
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
    path = os.path.abspath(path)
    tmp = f"{path}.partial-{os.getpid()}.png"
    try:
        fig.savefig(tmp, dpi=110)
        os.replace(tmp, path)
    except OSError as exc:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise OutputError(f"cannot write the plot ({exc.strerror or exc})", path) from None
    finally:
        plt.close(fig)
    return path
