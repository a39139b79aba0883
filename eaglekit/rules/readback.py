"""Upgrade's read-back rules: the output, re-read as eaglekit reads any draft, must say exactly what was decided.

They judge written files against the upgrade's plan and decisions, which only `eaglekit upgrade` holds, so they
fire only in `readback_findings` (an ordinary rules run has no plan and they stay silent there). They are
registered like every rule so that `eaglekit explain`, `validate --list-rules` and docs/rules.md know their codes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from eaglekit.findings import Finding
from eaglekit.rules.registry import Hit, RuleContext, registered, rule
from eaglekit.spec import DraftSpec

if TYPE_CHECKING:
    from eaglekit.upgrade.decide import Decisions
    from eaglekit.upgrade.plan import UpgradePlan

_MEMO_KEY = "upgrade_readback"
READBACK_CODES = ("EK191", "EK192", "EK193", "EK194", "EK195")


@dataclass(frozen=True)
class ReadBack:
    """What the output was planned and decided to be, and how it was re-read (named in every message)."""

    plan: UpgradePlan
    decisions: Decisions
    how: str  # "read as vllm", "detected as speculators", ...


def _read_back(ctx: RuleContext) -> ReadBack | None:
    return ctx.memo.get(_MEMO_KEY)


@rule("EK191", "error", "structure", None, "upgrade output: a planned tensor missing, or one written unplanned")
def readback_tensor_set(ctx: RuleContext):
    rb = _read_back(ctx)
    if rb is None:
        return
    planned = {s.name for s in rb.plan.written}
    written = {t.source_name for t in ctx.spec.tensors.values()}
    for name in sorted(planned ^ written):
        yield Hit(f"tensor {name!r} {'missing from' if name in planned else 'not planned in'} the output ({rb.how})",
                  tensor=name)


@rule("EK192", "error", "structure", None, "upgrade output: a tensor's dtype or shape is not the planned one")
def readback_tensor_shape(ctx: RuleContext):
    rb = _read_back(ctx)
    if rb is None:
        return
    planned = {s.name: (s.dtype, tuple(s.shape)) for s in rb.plan.written}
    written = {t.source_name: (t.dtype, tuple(t.shape)) for t in ctx.spec.tensors.values()}
    for name in sorted(planned.keys() & written.keys()):
        if planned[name] != written[name]:
            yield Hit(f"tensor {name!r} is {written[name]}, planned {planned[name]} ({rb.how})", tensor=name)


@rule("EK193", "error", "structure", None, "upgrade output: aux layer ids read back are not the decided ones")
def readback_aux_ids(ctx: RuleContext):
    rb = _read_back(ctx)
    if rb is not None and ctx.spec.aux.ids != rb.decisions.aux.ids:
        yield Hit(f"aux ids read back as {ctx.spec.aux.ids}, decided {rb.decisions.aux.ids} ({rb.how})",
                  key="eagle_aux_hidden_state_layer_ids")


@rule("EK194", "error", "structure", None, "upgrade output: K read back is not the decided one")
def readback_k(ctx: RuleContext):
    rb = _read_back(ctx)
    if rb is not None and ctx.spec.num_aux_hidden_states != rb.decisions.num_aux:
        yield Hit(f"K read back as {ctx.spec.num_aux_hidden_states}, decided {rb.decisions.num_aux} ({rb.how})")


@rule("EK195", "error", "structure", None, "upgrade output: a norm flag read back is not the decided one")
def readback_flags(ctx: RuleContext):
    rb = _read_back(ctx)
    if rb is None:
        return
    for key in ("fc_norm", "norm_output", "norm_before_residual"):
        value, read = getattr(rb.decisions, key), getattr(ctx.spec.flags, key)
        if read != value:
            yield Hit(f"{key} read back as {read}, decided {value} ({rb.how})", key=key)


def readback_findings(out: DraftSpec, plan: UpgradePlan, decisions: Decisions, how: str) -> list[Finding]:
    """The read-back rules' findings for one reading (`how`) of an upgrade's output."""
    ctx = RuleContext(out, out.target, None, None, {_MEMO_KEY: ReadBack(plan, decisions, how)})
    return [Finding(r.code, r.severity, hit.message, r.pitfall, hit.tensor, hit.key,
                    r.refuses_load if hit.refuses_load is None else hit.refuses_load)
            for r in registered() if r.code in READBACK_CODES for hit in r.check(ctx)]
