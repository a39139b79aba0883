"""The serving verdict, in one place for inspect, validate, upgrade, the model card and eaglekit.json.

`serving_support` says whether each engine serves a draft as is (no error from the file rules) and from which
version; `minimum_versions` gives the version floors alone, for a draft that already passed validation.
Both read the floors from eaglekit.engines, so no two outputs can disagree on a minimum version.
"""

from __future__ import annotations

from dataclasses import dataclass

from eaglekit.engines import (
    ENGINES,
    LATEST,
    SGLANG,
    VLLM,
    VLLM_OLDEST_KNOWN,
    Version,
    format_version,
    sglang_requirements,
    vllm_requirements,
)
from eaglekit.rules import run_rules
from eaglekit.spec import DraftSpec
from eaglekit.target import TargetInfo

ENGINE_LABELS = {VLLM: "vLLM", SGLANG: "SGLang"}


@dataclass(frozen=True)
class EngineSupport:
    """Whether an engine serves the draft as is, and from which version."""

    engine: str
    min_version: str | None  # None: cannot serve it as is
    as_is: bool
    reason: str


@dataclass(frozen=True)
class MinimumVersion:
    engine: str
    version: str | None  # None: no floor above the oldest release modelled
    reasons: tuple[str, ...]


def _floors(spec: DraftSpec, engine: str) -> list[tuple[Version, str]]:
    return vllm_requirements(spec) if engine == VLLM else sglang_requirements(spec)


def minimum_versions(spec: DraftSpec) -> dict[str, MinimumVersion]:
    """Per engine: the lowest version whose EAGLE-3 code reads everything this draft relies on, and why."""
    out = {}
    for engine in ENGINES:
        needs = _floors(spec, engine)
        floor = format_version(max(v for v, _ in needs)) if needs else None
        out[engine] = MinimumVersion(engine, floor, tuple(why for _, why in needs))
    return out


def serving_support(spec: DraftSpec, target: TargetInfo | None = None) -> list[EngineSupport]:
    """Which vLLM / SGLang versions serve this draft as is: no errors from the file rules, then the version floors."""
    floors = minimum_versions(spec)
    out = []
    for engine in ENGINES:
        report = run_rules(spec, target=target, engine=engine, groups=("structure", "target", "engine"))
        errors = [f for f in report.findings if f.severity == "error"]
        warnings = [f for f in report.findings if f.severity == "warning"]
        if errors:
            more = f" (+{len(errors) - 1} more)" if len(errors) > 1 else ""
            out.append(EngineSupport(engine, None, False, f"{errors[0].code}: {errors[0].message}{more}"))
            continue
        need = floors[engine]
        if engine == VLLM:
            floor = need.version or VLLM_OLDEST_KNOWN
            reason = "; ".join(need.reasons) or f"plain EAGLE-3 layout (checked against {VLLM_OLDEST_KNOWN}..{LATEST[VLLM]})"
        else:
            floor, reason = LATEST[SGLANG], f"checked against SGLang {LATEST[SGLANG]} only"
        if warnings:
            reason += f"; {len(warnings)} warning(s), first {warnings[0].code}: {warnings[0].message}"
        out.append(EngineSupport(engine, floor, True, reason))
    return out
