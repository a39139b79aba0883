"""bench's picture: speed-up against concurrency (one line per category), and per-user tokens/s both ways."""

from __future__ import annotations

import os
from typing import Any

from eaglekit.bench.report import PAYS, BenchReport
from eaglekit.decode.stats import MIN_SAMPLES
from eaglekit.errors import OutputError
from eaglekit.plotting import pyplot, save_figure


def plot_bench(report: BenchReport, path: str) -> str:
    """Write the PNG to `path` (atomically); its absolute path."""
    if not report.rows:
        raise OutputError("nothing was measured, nothing to plot", path)
    if not report.has_baseline:
        raise OutputError("no baseline was measured, so no speed-up to plot", path)
    return save_figure(bench_figure(report), path, dpi=110)


def bench_figure(report: BenchReport) -> Any:
    """The figure: a category's speed-up is shaded with its interval only where every concurrency has one (none
    below MIN_SAMPLES requests)."""
    plt = pyplot()
    fig, (speed, rates) = plt.subplots(1, 2, figsize=(11, 4))
    banded = False
    for i, category in enumerate(report.categories):
        rows = sorted((r for r in report.rows if r.category == category), key=lambda r: r.concurrency)
        levels = [r.concurrency for r in rows]
        label = category or "all prompts"
        colour = f"C{i}"
        speed.plot(levels, [r.speed_up for r in rows], color=colour, marker="o", label=label)
        intervals = [r.speed_up_interval for r in rows]
        if all(iv is not None for iv in intervals):
            speed.fill_between(levels, [iv.low for iv in intervals if iv], [iv.high for iv in intervals if iv],
                               color=colour, alpha=0.15)
            banded = True
        rates.plot(levels, [r.speculative.per_user.mean for r in rows], color=colour, marker="o",
                   label=f"{label}: with draft")
        rates.plot(levels, [r.baseline.per_user.mean if r.baseline else 0.0 for r in rows], color=colour,
                   marker="s", linestyle="--", label=f"{label}: target alone")
    speed.axhline(PAYS, color="grey", linewidth=1)
    engine = report.engine
    speed.set(xscale="log", xlabel="concurrency", ylabel="speed-up (mean per-user tokens/s)",
              title="speed-up (shaded: 95 % interval)" if banded
              else f"speed-up (no interval: fewer than {MIN_SAMPLES} requests)")
    rates.set(xscale="log", xlabel="concurrency", ylabel="per-user output tokens/s", title="per-user tokens/s")
    for axis in (speed, rates):
        axis.set_xticks(sorted({r.concurrency for r in report.rows}), labels=None)
        axis.get_xaxis().set_major_formatter(plt.matplotlib.ticker.ScalarFormatter())
        axis.legend(fontsize="small")
    draft, target = (os.path.basename(os.path.normpath(p)) for p in (report.draft, report.target))
    fig.suptitle(f"{draft} on {target}: vLLM {engine.get('version')} ({engine.get('device_type')}), {report.dtype}, "
                 f"k={report.num_speculative_tokens}", fontsize="medium")
    fig.tight_layout()
    return fig
