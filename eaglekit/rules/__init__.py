"""The rule engine behind validate, inspect, upgrade and push: every check is a registered rule with a stable code.

Groups: structure (config + headers), target (needs the target's config), engine (one serving engine and
version), deep (tensor values, one streaming pass). Only deep reads tensor bytes; nothing here imports torch.
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from dataclasses import dataclass, field

import eaglekit.rules.deep
import eaglekit.rules.structure
import eaglekit.rules.target  # noqa: F401 (importing a rule module registers its rules)
from eaglekit.engines import (
    RECORDS,
    Engine,
    Version,
    format_version,
    parse_version,
)
from eaglekit.engines.conflicts import conflicts
from eaglekit.errors import UsageError
from eaglekit.findings import Finding
from eaglekit.rules.expected import expected_tensors, tensor_expectations
from eaglekit.rules.registry import GROUPS, Rule, RuleContext, registered
from eaglekit.rules.target import DECODE, DECODE_CODES, DecodeReading, wrong_target
from eaglekit.spec import DraftSpec
from eaglekit.target import TargetInfo

__all__ = ["GROUPS", "Rule", "ValidationReport", "all_rules", "decode_findings", "expected_tensors", "rule_fix",
           "run_rules", "tensor_expectations", "upgrade_command", "upgrade_refusals"]
DEFAULT_GROUPS = ("structure", "target", "engine")
for _engine in RECORDS.values():
    importlib.import_module(_engine.rules_module)  # each engine's rules register on import


def all_rules() -> list[Rule]:
    """Every rule, ordered by code."""
    return registered()


@dataclass
class ValidationReport:
    """The findings of one run, and what was checked."""

    path: str
    findings: list[Finding]
    groups: tuple[str, ...]
    engines: dict[str, str] = field(default_factory=dict)  # engine -> version checked
    fixes: dict[str, str | None] = field(default_factory=dict)  # engine -> the upgrade that serves it (None: none)
    settings: dict[str, tuple[str, ...]] = field(default_factory=dict)  # engine -> what to pass it beside the files
    conflicts: list[str] = field(default_factory=list)  # engines that read one key of this config differently
    target_mismatch: str | None = None  # the draft was built for another model than --target (rules/target.py)

    @property
    def fix(self) -> str | None:
        """The first checked engine's fix: the command that rewrites what its failing rules check."""
        return next((f for f in self.fixes.values() if f), None)

    def count(self, severity: str) -> int:
        return sum(1 for f in self.findings if f.severity == severity)

    @property
    def errors(self) -> int:
        return self.count("error")

    @property
    def warnings(self) -> int:
        return self.count("warning")

    @property
    def infos(self) -> int:
        return self.count("info")

    @property
    def ok(self) -> bool:
        return self.errors == 0

    def errors_for(self, engine: str) -> int:
        """Errors that stop this engine: its own rules' and the engine-neutral ones."""
        owner = {r.code: r.engine for r in all_rules()}
        return sum(1 for f in self.findings if f.severity == "error" and owner.get(f.code) in (None, engine))

    def failed(self, strict: bool = False) -> bool:
        return self.errors > 0 or (strict and self.warnings > 0)

    def to_dict(self, strict: bool = False) -> dict:
        return {
            "path": self.path,
            "ok": not self.failed(strict),
            "strict": strict,
            "errors": self.errors,
            "warnings": self.warnings,
            "infos": self.infos,
            "groups": list(self.groups),
            "engines": [{"engine": e, "version": v, "errors": n, "ok": n == 0,
                         "settings": list(self.settings.get(e, ())), "fix": self.fixes.get(e)}
                        for e, v in self.engines.items() for n in [self.errors_for(e)]],
            "findings": [f.to_dict() for f in self.findings],
            "fix": self.fix,
            "conflicts": list(self.conflicts),
            "target_mismatch": self.target_mismatch,
        }


def checked_engines(engine: str, engine_version: str | None) -> dict[str, Version]:
    """The engine(s) and version(s) to model: one engine, a comma list, or all; a version older than eaglekit
    models is a usage error."""
    names = list(RECORDS) if engine == "all" else [e.strip() for e in engine.split(",") if e.strip()]
    unknown = [e for e in names if e not in RECORDS]
    if unknown or not names:
        raise UsageError(f"unknown engine {(unknown or [engine])[0]!r}; known: {', '.join(RECORDS)}, all "
                         "(or a comma list)")
    if len(names) > 1:
        if engine_version is not None:
            raise UsageError(f"--engine-version needs a single --engine ({', '.join(RECORDS)}), not {engine}")
        return {e: parse_version(r.latest) for e, r in RECORDS.items() if e in names}
    version = parse_version(engine_version or RECORDS[engine].latest)
    oldest = RECORDS[engine].oldest
    if version < parse_version(oldest):
        raise UsageError(f"--engine-version {engine_version}: eaglekit models {engine} from {oldest} on (EAGLE-3 "
                         "support is younger than that); a verdict for an older release would be a guess")
    return {engine: version}


def run_rules(
    spec: DraftSpec,
    *,
    target: TargetInfo | None = None,
    engine: str = "vllm",
    engine_version: str | None = None,
    deep: bool = False,
    groups: tuple[str, ...] | None = None,
) -> ValidationReport:
    """Run the selected rule groups over a draft. engine names one engine record, a comma list or all; versions
    default to the latest modelled."""
    selected = tuple(groups) if groups is not None else DEFAULT_GROUPS
    unknown = [g for g in selected if g not in GROUPS]
    if unknown:
        raise UsageError(f"unknown rule group(s) {unknown}; known: {', '.join(GROUPS)}")
    if deep and "deep" not in selected:
        selected += ("deep",)
    versions = checked_engines(engine, engine_version)
    target = target or spec.target
    neutral = RuleContext(spec, target, None, None)
    contexts = {e: RuleContext(spec, target, e, v) for e, v in versions.items()}

    findings: list[Finding] = []
    for r in all_rules():
        if r.group not in selected or (r.group == "target" and target is None):
            continue
        if (r.engine is not None and r.engine not in contexts) or r.code in DECODE_CODES:
            continue  # the decode rules hold the draft to a decode this run has not: decode_findings runs them
        ctx = contexts[r.engine] if r.engine else neutral
        findings += r.findings(ctx)
    checked = {e: format_version(v) for e, v in versions.items()} if "engine" in selected else {}
    ran = tuple(g for g in selected if g != "target" or target is not None)
    mismatch = wrong_target(spec, target) if "target" in ran and target is not None else None
    fixes = {e: None if mismatch else fix_command(spec, findings, e) for e in checked}  # no fix for a wrong target
    settings = {e: RECORDS[e].settings(spec, target) for e in checked}
    clashes = conflicts(spec, tuple(checked), target) if len(checked) > 1 else []
    return ValidationReport(spec.path, findings, ran, checked, fixes, settings, clashes, mismatch)


def upgrade_refusals(spec: DraftSpec, engine: str | None = None) -> list[Finding]:
    """The errors upgrade refuses a source for: the hits of the `refuses_upgrade` rules, engine-neutral ones and
    those of `engine` (the output's, at its latest modelled version). validate reports the very same findings."""
    contexts: dict[str | None, RuleContext] = {None: RuleContext(spec, spec.target, None, None)}
    if engine is not None:
        contexts[engine] = RuleContext(spec, spec.target, engine, parse_version(RECORDS[engine].latest))
    return [f for r in all_rules() if r.refuses_upgrade and r.engine in contexts
            for f in r.findings(contexts[r.engine])]


def decode_findings(spec: DraftSpec, target: TargetInfo, aux_ids: Sequence[int] | None, aux_source: str,
                    served: ValidationReport) -> list[Finding]:
    """The decode rules' findings (EK291..EK299) for a draft resolved against `target` that a decode runs with
    `aux_ids`: judged on the draft as written (what it records itself), and beside `served`, the command's vLLM rules
    run, whose errors say vLLM reads the files otherwise. An error among them refuses the decode."""
    vllm_errors = tuple(f for f in served.findings if f.severity == "error")
    reading = DecodeReading(None if aux_ids is None else tuple(aux_ids), aux_source, spec.num_aux_hidden_states,
                            served.engines.get("vllm", ""), vllm_errors, served.fix)
    ctx = RuleContext(spec.as_written, target, None, None, {DECODE: reading})
    return [f for r in all_rules() if r.code in DECODE_CODES for f in r.findings(ctx)]


def fix_command(spec: DraftSpec, findings: list[Finding], engine: str) -> str | None:
    """`eaglekit upgrade` rewrites names, ids and config for the engine: the fix for its engine-group errors,
    None when there are none or one of them is not what an upgrade fixes (a function the engine lacks, a release
    too old, a source upgrade refuses: the rule's own fix says what is).
    An EAGLE-3 source keeps its function (no fc_norm / norm_output added); a 3.1 source keeps its trained norms."""
    rules = {r.code: r for r in all_rules()}
    failing = [rules[f.code] for f in findings if f.severity == "error" and f.code in rules
               and rules[f.code].group == "engine" and rules[f.code].engine == engine]
    record = RECORDS[engine]
    if not all(r.fixed_by_upgrade for r in failing) or not (failing or record.needs_conversion):
        return None  # an engine that loads GGUF only: the conversion is its fix even when nothing fails
    keep = " --no-fc-norm --no-norm-output" if spec.eagle_version == "3" else ""
    target = record.upgrade_target(spec.target.path if spec.target is not None else None)
    if target is None:
        return None  # the conversion needs the target's GGUF file: Engine.conversion_hint says so
    return upgrade_command(record, spec.path, target, keep)


def upgrade_command(record: Engine, draft: str, target: str, keep: str = "") -> str:
    """The upgrade that writes what `record`'s engine reads, as validate prints it and explain names it: each path
    quoted for the shell, so the command runs when pasted."""
    import shlex

    return (f"eaglekit upgrade {shlex.quote(draft)} {shlex.quote(record.upgrade_output(draft))}{target}"
            f"{record.upgrade_flag()}{keep}")


def rule_fix(rule: Rule) -> str | None:
    """What to do about a hit of `rule`, in one sentence: the upgrade for the engine rules it rewrites, what serves
    the draft instead where no rewrite can, else the rule's own sentence (None: a rule registered without one)."""
    if rule.engine is None or rule.refuses_upgrade or (rule.convertible and not rule.fixed_by_upgrade):
        return rule.fix
    record = RECORDS[rule.engine]
    if not rule.convertible:
        return f"no rewrite of the files serves it on {record.label}: {rule.fix}" if rule.fix else None
    target = " --target TARGET.gguf" if record.needs_conversion else ""
    return (f"`{upgrade_command(record, 'DRAFT', target)}` writes what {record.label} reads; an EAGLE-3 draft keeps "
            f"its function with --no-fc-norm --no-norm-output (`eaglekit validate DRAFT --engine {record.name}` "
            "prints the command for a draft)")
