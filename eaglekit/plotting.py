"""What every PNG eaglekit writes shares: matplotlib without a display, and an atomic save."""

from __future__ import annotations

import importlib.util
import os

from eaglekit.errors import UsageError
from eaglekit.io.publish import publish

MATPLOTLIB_MISSING = "--plot needs matplotlib: pip install 'eaglekit[plot]'"


def pyplot():
    """matplotlib.pyplot on the Agg backend (no display needed), or one clear line when it is not installed."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise UsageError(MATPLOTLIB_MISSING) from None
    return plt


def check_plot_path(path: str) -> None:
    """Refuse, before any work, a plot that cannot be drawn: a folder, or no matplotlib. Where it may lie among a
    command's inputs and outputs is `eaglekit.io.outputs.refuse_clobber`'s to say."""
    if os.path.isdir(path):
        raise UsageError("--plot is a folder: give a file name such as acceptance.png", path)
    if importlib.util.find_spec("matplotlib") is None:
        raise UsageError(MATPLOTLIB_MISSING)


def save_figure(fig, path: str, *, dpi: int) -> str:
    """Write `fig` to `path` atomically (a failed or killed save leaves no half PNG); its absolute path."""
    plt = pyplot()
    try:
        publish(path, lambda stage: fig.savefig(stage.path, dpi=dpi, format="png"), replace=True, what="the plot")
        return os.path.abspath(path)
    finally:
        plt.close(fig)
