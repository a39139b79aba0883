"""The serving verdict, in one place for inspect, validate, upgrade, the model card and eaglekit.json.

`serving_support` says, per engine, whether it serves a draft's files as they are, with which settings, only after
a conversion (llama.cpp loads GGUF), or not at all, and from which version; `minimum_versions` gives the version
floors alone, for a draft that already passed validation. Both read the floors from eaglekit.engines, so no two
outputs can disagree on a minimum version. `serve_command` spells out each engine's command, settings included.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from eaglekit.engines import (
    ENGINES,
    LABELS,
    LATEST,
    LLAMACPP,
    OLDEST_MODELLED,
    SGLANG,
    TOKENSPEED,
    TRTLLM,
    VLLM,
    engine_requirements,
    format_version,
)
from eaglekit.rules import all_rules, run_rules
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
    engine: str
    version: str | None  # None: no floor above the oldest release modelled
    reasons: tuple[str, ...]


def minimum_versions(spec: DraftSpec) -> dict[str, MinimumVersion]:
    """Per engine: the lowest version whose EAGLE-3 code reads everything this draft relies on, and why."""
    out = {}
    for engine in ENGINES:
        needs = engine_requirements(spec, engine)
        floor = format_version(max(v for v, _ in needs)) if needs else None
        out[engine] = MinimumVersion(engine, floor, tuple(why for _, why in needs))
    return out


def serving_support(spec: DraftSpec, target: TargetInfo | None = None) -> list[EngineSupport]:
    """Per engine: no errors from the file rules (then the version floor and any settings), or why not."""
    floors = minimum_versions(spec)
    out = []
    for engine in ENGINES:
        report = run_rules(spec, target=target, engine=engine, groups=("structure", "target", "engine"))
        errors = [f for f in report.findings if f.severity == "error"]
        warnings = [f for f in report.findings if f.severity == "warning"]
        fix, settings = report.fixes.get(engine), report.settings.get(engine, ())
        if errors:
            more = f" (+{len(errors) - 1} more)" if len(errors) > 1 else ""
            reason = f"{errors[0].code}: {errors[0].message}{more}"
            own = {r.code for r in all_rules() if r.engine == engine}
            out.append(EngineSupport(engine, None, False, reason, NOT_AS_IS, settings, fix,
                                     any(f.code in own for f in errors)))
            continue
        need = floors[engine]
        if engine == VLLM:
            floor = need.version or OLDEST_MODELLED[VLLM]
            reason = "; ".join(need.reasons) or (f"plain EAGLE-3 layout (checked against {OLDEST_MODELLED[VLLM]}.."
                                                 f"{LATEST[VLLM]})")
        else:
            floor = need.version or LATEST[engine]
            reason = f"checked against {LABELS[engine]} {LATEST[engine]} only"
        if warnings:
            reason += f"; {len(warnings)} warning(s), first {warnings[0].code}: {warnings[0].message}"
        if engine == LLAMACPP:
            out.append(EngineSupport(engine, floor, False, "loads GGUF only; " + reason, AFTER_CONVERSION, (), fix))
        else:
            out.append(EngineSupport(engine, floor, True, reason, WITH_SETTINGS if settings else AS_IS, settings))
    return out


def serve_command(engine: str, target: str, draft: str, k: int, settings: tuple[str, ...] = ()) -> str:
    """The command that serves `target` with `draft` proposing k tokens, the engine's settings included."""
    if engine == VLLM:
        config = json.dumps({"model": draft, "method": "eagle3", "num_speculative_tokens": k})
        return f"vllm serve {target} --speculative-config '{config}'"
    if engine == SGLANG:
        return (f"python -m sglang.launch_server --model {target} --speculative-algorithm EAGLE3 "
                f"--speculative-draft-model-path {draft} --speculative-num-steps {k} --speculative-eagle-topk 1 "
                f"--speculative-num-draft-tokens {k + 1}")
    if engine == TOKENSPEED:
        return " ".join([f"tokenspeed serve {target} --speculative-algorithm EAGLE3 --speculative-draft-model-path "
                         f"{draft} --speculative-num-steps {k} --speculative-eagle-topk 1 "
                         f"--speculative-num-draft-tokens {k + 1}", *settings])
    if engine == TRTLLM:
        lines = ["cat > eagle3.yaml <<'EOF'", "speculative_config:", "  decoding_type: Eagle3",
                 f"  max_draft_len: {k}", f"  speculative_model: {draft}", *(f"  {s}" for s in settings), "EOF",
                 f"trtllm-serve {target} --extra_llm_api_options eagle3.yaml"]
        return "\n".join(lines)
    if engine == LLAMACPP:
        return f"llama-server -m {target} -md {draft} --spec-type draft-eagle3 --spec-draft-n-max {k}"
    raise ValueError(f"unknown engine {engine!r}")
