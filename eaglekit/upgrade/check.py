"""Re-open a written output and hold it to the plan (the read-back rules) and the engine's rules; errors mean it is
not published."""

from __future__ import annotations

from types import ModuleType

from eaglekit.families import load_draft
from eaglekit.findings import Finding
from eaglekit.rules.registry import READBACK, READBACK_CODES, READBACK_FLAGS, ReadBack, RuleContext, registered
from eaglekit.spec import DraftSpec
from eaglekit.target import TargetInfo
from eaglekit.upgrade.decide import Decisions
from eaglekit.upgrade.plan import UpgradePlan


def readback_findings(out: DraftSpec, plan: UpgradePlan, d: Decisions, how: str) -> list[Finding]:
    """The read-back rules' findings (EK191..EK195) for one reading (`how`) of the output: it must say exactly what
    was planned and decided."""
    planned = ReadBack({s.name: (s.dtype, tuple(s.shape)) for s in plan.written}, d.aux.ids, d.num_aux,
                       {key: getattr(d, key) for key in READBACK_FLAGS}, how)
    ctx = RuleContext(out, out.target, None, None, {READBACK: planned})
    return [Finding(r.code, r.severity, hit.message, r.pitfall, hit.tensor, hit.key,
                    r.refuses_load if hit.refuses_load is None else hit.refuses_load)
            for r in registered() if r.code in READBACK_CODES for hit in r.check(ctx)]


def check_output(path: str, source: DraftSpec, plan: UpgradePlan, d: Decisions, dialect: ModuleType,
                 target: TargetInfo | None) -> tuple[DraftSpec, list[Finding]]:
    """Findings about the written directory: round trip (as the dialect's family and as detected) plus rules."""
    from eaglekit.rules import run_rules

    out = load_draft(path, family=dialect.read_family(source, d), target=target)
    findings = readback_findings(out, plan, d, f"read as {out.family}")
    detected = load_draft(path, target=target)
    if detected.family != out.family:
        findings += readback_findings(detected, plan, d, f"detected as {detected.family}")
    report = run_rules(out, target=target, engine=dialect.ENGINE)
    findings += list(report.findings)
    return out, findings
