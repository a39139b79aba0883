"""What every PNG eaglekit writes shares: matplotlib without a display, and an atomic save."""

from __future__ import annotations

import os

from eaglekit.errors import OutputError, UsageError

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


def save_figure(fig, path: str, *, dpi: int) -> str:
    """Write `fig` to `path` beside itself first, then rename: a failed or killed save leaves no half PNG."""
    plt = pyplot()
    path = os.path.abspath(path)
    tmp = f"{path}.partial-{os.getpid()}.png"
    try:
        fig.savefig(tmp, dpi=dpi)
        os.replace(tmp, path)
    except OSError as exc:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise OutputError(f"cannot write the plot ({exc.strerror or exc})", path) from None
    finally:
        plt.close(fig)
    return path
