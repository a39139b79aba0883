"""A PNG of acceptance under a sweep: τ and each draft position's acceptance against context length, one line per
template (and per draft for compare), so where a draft gains or loses is seen at a glance."""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from eaglekit.decode.metrics import AcceptanceCounter
from eaglekit.decode.settings import Condition
from eaglekit.decode.stats import pooled
from eaglekit.errors import OutputError
from eaglekit.plotting import pyplot, save_figure
from eaglekit.verify.report import VerifySweep

if TYPE_CHECKING:
    from eaglekit.decode.compare import CompareSweep

STYLES = ("-", "--", ":", "-.")  # one per draft; colours tell the templates apart


@dataclass(frozen=True)
class Line:
    """One template (and draft) across the context lengths measured, in ascending order."""

    template: str
    draft: str  # "" when a single draft was measured
    contexts: list[int]
    acceptance_length: list[float]
    per_position: list[list[float]]  # per context length, one rate per draft position

    @property
    def label(self) -> str:
        return f"{self.template}, {self.draft}" if self.draft else self.template


def lines(conditions: Sequence[Condition], measured: Mapping[str, Sequence[AcceptanceCounter]]) -> list[Line]:
    """One line per template and draft; `measured` maps a draft's name ("" for a single draft) to its pooled
    counters, one per condition in the conditions' order."""
    out = []
    for template in dict.fromkeys(c.template for c in conditions):
        for name, counters in measured.items():
            points = sorted((c.context_tokens, counter) for c, counter in zip(conditions, counters)
                            if c.template == template)
            out.append(Line(template, name, [x for x, _ in points],
                            [counter.acceptance_length for _, counter in points],
                            [counter.per_position for _, counter in points]))
    return out


def plot_verify(sweep: VerifySweep, path: str) -> str:
    """verify's sweep: one line per template."""
    draft = os.path.basename(os.path.normpath(sweep.reports[0].draft))
    return plot_conditions(lines(sweep.conditions, {"": [r.counter for r in sweep.reports]}), path,
                           title=f"{draft}: acceptance by context length and template")


def plot_compare(sweep: CompareSweep, path: str) -> str:
    """compare's sweep: one line per template and draft (A solid, B dashed), each pooled over all prompts."""
    k = sweep.reports[0].settings.num_speculative_tokens
    measured = {"A": [pooled(r.a.counters, k) for r in sweep.reports],
                "B": [pooled(r.b.counters, k) for r in sweep.reports]}
    a, b = (os.path.basename(os.path.normpath(m.draft)) for m in (sweep.reports[0].a, sweep.reports[0].b))
    return plot_conditions(lines(sweep.conditions, measured), path,
                           title=f"A: {a} (solid) vs B: {b} (dashed), by context length and template")


def plot_conditions(series: Sequence[Line], path: str, *, title: str) -> str:
    """Write τ and one panel per draft position against context length to `path` (atomically); its absolute
    path."""
    plt = pyplot()
    if not series:
        raise OutputError("nothing was measured, nothing to plot", path)
    k = len(series[0].per_position[0])
    panels = 1 + k
    columns = 2 if panels <= 4 else 3
    rows = math.ceil(panels / columns)
    fig, axes = plt.subplots(rows, columns, figsize=(5 * columns, 3.6 * rows), squeeze=False)
    flat = list(axes.flat)
    colours = {template: f"C{i}" for i, template in enumerate(dict.fromkeys(line.template for line in series))}
    styles = {draft: STYLES[i % len(STYLES)] for i, draft in enumerate(dict.fromkeys(line.draft for line in series))}
    for line in series:
        colour, style = colours[line.template], styles[line.draft]
        flat[0].plot(line.contexts, line.acceptance_length, style, color=colour, marker="o", label=line.label)
        for position in range(k):
            flat[1 + position].plot(line.contexts, [rates[position] for rates in line.per_position], style,
                                    color=colour, marker="o", label=line.label)
    flat[0].set(xlabel="context tokens", ylabel="τ (mean acceptance length)", title="τ")
    flat[0].legend(fontsize="small")
    for position in range(k):
        flat[1 + position].set(xlabel="context tokens", ylabel="acceptance", ylim=(-0.02, 1.02),
                               title=f"draft position {position + 1}")
    for unused in flat[panels:]:
        unused.set_visible(False)
    fig.suptitle(title)
    fig.tight_layout()
    return save_figure(fig, path, dpi=100)
