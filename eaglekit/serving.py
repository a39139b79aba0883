"""The serving verdict, in one place for inspect, validate, upgrade, the model card and eaglekit.json.

`serving_support` says, per engine, whether it serves a draft's files as they are, with which settings, only after
a conversion (llama.cpp loads GGUF), or not at all, and from which version; `minimum_versions` gives the version
floors alone, for a draft that already passed validation. Both read the floors from eaglekit.engines, so no two
outputs can disagree on a minimum version. `serve_command` spells out each engine's command, settings included.
"""

from __future__ import annotations

from dataclasses import dataclass

from eaglekit.engines import RECORDS, format_version
from eaglekit.rules import ValidationReport, all_rules, run_rules
from eaglekit.spec import DraftSpec
from eaglekit.target import TargetInfo

AS_IS, WITH_SETTINGS, AFTER_CONVERSION, NOT_AS_IS = "as is", "with settings", "after conversion", "not as is"


@dataclass(frozen=True)
class EngineSupport:
    """Whether an engine serves the draft's files as they are, and from which version."""

    engine: str
    min_version: str | None  # None: cannot serve it as is
    as_is: bool
    reason: str
    verdict: str = AS_IS  # as is | with settings | after conversion | not as is
    settings: tuple[str, ...] = ()  # what to pass the engine beside the files
    fix: str | None = None  # the eaglekit upgrade that writes what it reads (None: none can)
    engine_specific: bool = False  # an error of this engine's own rules blocks it (not a fault of the files alone)


@dataclass(frozen=True)
class MinimumVersion:
    """The lowest release of an engine that reads everything a draft relies on, and why."""

    engine: str
    version: str | None  # None: no floor above the oldest release modelled
    reasons: tuple[str, ...]


def minimum_versions(spec: DraftSpec) -> dict[str, MinimumVersion]:
    """Per engine: the lowest version whose EAGLE-3 code reads everything this draft relies on, and why."""
    out = {}
    for engine in RECORDS:
        needs = RECORDS[engine].requirements(spec)
        floor = format_version(max(v for v, _ in needs)) if needs else None
        out[engine] = MinimumVersion(engine, floor, tuple(why for _, why in needs))
    return out


def serving_support(spec: DraftSpec, target: TargetInfo | None = None,
                    report: ValidationReport | None = None) -> list[EngineSupport]:
    """Per engine: no errors from the file rules (then the version floor and any settings), or why not.
    `report`: a rules run over every engine (structure, target and engine groups) the caller already has."""
    floors = minimum_versions(spec)
    if report is None:
        report = run_rules(spec, target=target, engine=",".join(RECORDS), groups=("structure", "target", "engine"))
    missing = [e for e in RECORDS if e not in report.engines]
    if missing:
        raise ValueError(f"serving_support needs a rules run over every engine; {missing} not checked")
    engine_of = {r.code: r.engine for r in all_rules()}
    out = []
    for engine in RECORDS:
        findings = [f for f in report.findings if engine_of.get(f.code) in (None, engine)]
        errors = [f for f in findings if f.severity == "error"]
        warnings = [f for f in findings if f.severity == "warning"]
        fix, settings = report.fixes.get(engine), report.settings.get(engine, ())
        if errors:
            more = f" (+{len(errors) - 1} more)" if len(errors) > 1 else ""
            reason = f"{errors[0].code}: {errors[0].message}{more}"
            out.append(EngineSupport(engine, None, False, reason, NOT_AS_IS, settings, fix,
                                     any(engine_of.get(f.code) == engine for f in errors)))
            continue
        need, record = floors[engine], RECORDS[engine]
        if record.versions_modelled:
            floor = need.version or record.oldest
            reason = "; ".join(need.reasons) or (f"plain EAGLE-3 layout (checked against {record.oldest}.."
                                                 f"{record.latest})")
        else:
            floor = need.version or record.latest
            reason = f"checked against {record.label} {record.latest} only"
        if warnings:
            reason += f"; {len(warnings)} warning(s), first {warnings[0].code}: {warnings[0].message}"
        if record.needs_conversion:
            out.append(EngineSupport(engine, floor, False, f"loads {record.loads.upper()} only; " + reason,
                                     AFTER_CONVERSION, (), fix))
        else:
            out.append(EngineSupport(engine, floor, True, reason, WITH_SETTINGS if settings else AS_IS, settings))
    return out


def serve_command(engine: str, target: str, draft: str, k: int, settings: tuple[str, ...] = ()) -> str:
    """The command that serves `target` with `draft` proposing k tokens, the engine's settings included."""
    return RECORDS[engine].serve(target, draft, k, settings)
