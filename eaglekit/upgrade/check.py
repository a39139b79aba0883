"""Re-open a written output and hold it to the plan and the vLLM-ready rules; errors mean it is not published."""

from __future__ import annotations

from types import ModuleType

from eaglekit.families import load_draft
from eaglekit.findings import Finding
from eaglekit.spec import DraftSpec
from eaglekit.target import TargetInfo
from eaglekit.upgrade.decide import Decisions
from eaglekit.upgrade.plan import UpgradePlan


def _round_trip(out: DraftSpec, plan: UpgradePlan, d: Decisions, how: str) -> list[Finding]:
    """The output, read back as eaglekit reads any draft, must say exactly what was decided."""
    found: list[Finding] = []

    def error(code: str, message: str, tensor: str | None = None, key: str | None = None) -> None:
        found.append(Finding(code, "error", f"{message} ({how})", None, tensor, key))

    planned = {s.name: (s.dtype, tuple(s.shape)) for s in plan.written}
    written = {t.source_name: (t.dtype, tuple(t.shape)) for t in out.tensors.values()}
    for name in sorted(planned.keys() ^ written.keys()):
        error("UPGRADE_TENSOR_SET", f"tensor {name!r} {'missing from' if name in planned else 'not planned in'} "
                                    "the output", tensor=name)
    for name in sorted(planned.keys() & written.keys()):
        if planned[name] != written[name]:
            error("UPGRADE_TENSOR_SHAPE", f"tensor {name!r} is {written[name]}, planned {planned[name]}", tensor=name)
    if out.aux.ids != d.aux.ids:
        error("UPGRADE_AUX_IDS", f"aux ids read back as {out.aux.ids}, decided {d.aux.ids}",
              key="eagle_aux_hidden_state_layer_ids")
    if out.num_aux_hidden_states != d.num_aux:
        error("UPGRADE_K", f"K read back as {out.num_aux_hidden_states}, decided {d.num_aux}")
    for key, value in (("fc_norm", d.fc_norm), ("norm_output", d.norm_output),
                       ("norm_before_residual", d.norm_before_residual)):
        if getattr(out.flags, key) != value:
            error("UPGRADE_FLAG", f"{key} read back as {getattr(out.flags, key)}, decided {value}", key=key)
    return found


def check_output(path: str, source: DraftSpec, plan: UpgradePlan, d: Decisions, dialect: ModuleType,
                 target: TargetInfo | None) -> tuple[DraftSpec, list[Finding]]:
    """Findings about the written directory: round trip (as the dialect's family and as detected) plus rules."""
    from eaglekit.rules import run_rules

    out = load_draft(path, family=dialect.read_family(source, d), target=target)
    findings = _round_trip(out, plan, d, f"read as {out.family}")
    detected = load_draft(path, target=target)
    if detected.family != out.family:
        findings += _round_trip(detected, plan, d, f"detected as {detected.family}")
    report = run_rules(out, target=target, engine=dialect.ENGINE)
    findings += list(report.findings)
    return out, findings
