"""How vLLM will read a draft as its files stand: the aux ids its runner captures, the norm flags it reads, whether
its loader accepts the tensor names at all, and what it substitutes without a word.

verify decodes eaglekit's reading of a draft (what `eaglekit upgrade` writes so that every engine reads it the
same way). When vLLM would read the unchanged files differently, verify decodes them a second time as vLLM would
and reports both τ: what the draft delivers served as is, and what it delivers once upgraded.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from eaglekit.engines import RECORDS, VLLM, parse_version, vllm_default_runner, vllm_runner_ids, vllm_view
from eaglekit.engines.vllm import V2_FALLBACK_IDS
from eaglekit.rules import ValidationReport
from eaglekit.spec import DraftSpec
from eaglekit.target import TargetInfo

FLAGS = ("fc_norm", "norm_output", "norm_before_fc", "norm_before_residual")


@dataclass(frozen=True)
class ServedReading:
    engine: str  # e.g. "vLLM 0.33.0 (V2 runner)"
    aux_ids: tuple[int, ...]
    aux_source: str
    flags: dict[str, bool]
    refusal: str | None = None  # why its loader raises on these files
    silent: list[str] = field(default_factory=list)  # what it substitutes without a message
    fix: str | None = None  # the `eaglekit upgrade` command that writes what vLLM reads as eaglekit does

    def to_dict(self) -> dict:
        return {"engine": self.engine, "loads": self.refusal is None, "refusal": self.refusal,
                "aux_layer_ids": list(self.aux_ids), "aux_layer_ids_source": self.aux_source, "flags": self.flags,
                "silent": list(self.silent)}


def served_reading(spec: DraftSpec, target: TargetInfo, report: ValidationReport, version: str | None = None,
                   runner: str | None = None) -> ServedReading:
    """vLLM `version` (default: the latest modelled) with `runner` (default: that version's default runner for this
    target) reading the draft's files as they are; `report` is the command's vLLM rules run at that version (its
    refusals and fix)."""
    parsed = parse_version(version or RECORDS[VLLM].latest)
    runner = runner or vllm_default_runner(parsed, target.architectures[0] if target.architectures else None)
    view = vllm_view(spec, parsed)
    engine = f"vLLM {version or RECORDS[VLLM].latest} ({runner.upper()} runner)"
    ids = vllm_runner_ids(view, runner)
    if not ids:
        source = "its default (2, L//2, L-3)"
    elif runner == "v2":
        source = f"top-level {view.v2_key}" + (" + 1" if view.v2_key == V2_FALLBACK_IDS else "")
    else:
        source = "eagle_aux_hidden_state_layer_ids (top level, else eagle_config)"
    flags = {"fc_norm": view.fc_norm, "norm_output": view.norm_output, "norm_before_fc": view.norm_before_fc,
             "norm_before_residual": view.norm_before_residual}
    refusals = [f for f in report.findings if f.refuses_load]
    refusal = (f"{refusals[0].code} {refusals[0].message}" + (f" (+{len(refusals) - 1} more)" if len(refusals) > 1
                                                              else "")) if refusals else None
    silent = []
    K = view.k
    missing = [k for k in range(K) if k not in set(spec.facts.fc_norm_tensor_ids)]
    if view.fc_norm and missing:
        silent.append(f"fc_norm runs with all-ones weights for aux state(s) {missing} (no fc_norm.*.weight)")
    Vd = spec.vocab.draft_vocab_size
    if Vd and Vd < target.vocab_size and not spec.vocab.has_d2t:
        silent.append(f"maps draft id i to target id i (no d2t, Vd={Vd} < V={target.vocab_size})")
    if not ids:
        silent.append(f"captures its default aux ids {list(target.default_aux_ids)}: the draft names none it reads")
    return ServedReading(engine, tuple(sorted(ids or target.default_aux_ids)), source, flags, refusal, silent,
                         report.fixes.get(VLLM))
