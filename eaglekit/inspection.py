"""The inspect report: a DraftSpec flattened into the documented JSON shape, plus findings and engine support."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from eaglekit.errors import NotEagle3DraftError
from eaglekit.findings import Finding
from eaglekit.spec import DraftSpec
from eaglekit.target import TargetInfo

if TYPE_CHECKING:
    from eaglekit.other_drafts import OtherDraft


@dataclass
class InspectReport:
    """inspect's report for an EAGLE-3 draft: the spec, its file-level findings and each engine's verdict."""

    spec: DraftSpec
    findings: list[Finding]
    serving: list[Any]  # eaglekit.engines.EngineSupport
    target: TargetInfo | None = None
    include_tensors: bool = False
    extra: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        s = self.spec
        g = s.geometry
        doc: dict[str, Any] = {
            "path": s.path,
            "family": s.family,
            "producer": s.producer,
            "eagle_version": s.eagle_version,
            "attention": s.attention,
            "architectures": s.architectures,
            "model_type": s.model_type,
            "config_layout": s.config_layout,
            "hidden_size": g.hidden_size,
            "target_hidden_size": g.target_hidden_size,
            "intermediate_size": g.intermediate_size,
            "num_layers": g.num_layers,
            "num_attention_heads": g.num_heads,
            "num_key_value_heads": g.num_kv_heads,
            "head_dim": g.head_dim,
            "mla": None if g.mla is None else {
                "q_lora_rank": g.mla.q_lora_rank, "kv_lora_rank": g.mla.kv_lora_rank,
                "qk_nope_head_dim": g.mla.qk_nope_head_dim, "qk_rope_head_dim": g.mla.qk_rope_head_dim,
                "v_head_dim": g.mla.v_head_dim,
            },
            "rope_theta": g.rope_theta,
            "rope_scaling": g.rope_scaling,
            "sliding_window": g.sliding_window,
            "num_aux_hidden_states": s.num_aux_hidden_states,
            "aux_layer_ids": list(s.aux.ids) if s.aux.ids is not None else None,
            "aux_layer_ids_as_written": list(s.aux.as_written) if s.aux.as_written is not None else None,
            "aux_layer_id_convention": s.aux.convention,
            "aux_layer_id_convention_known": s.aux.convention_known,
            "aux_layer_ids_source": s.aux.source,
            "vocab_size": s.vocab.vocab_size,
            "draft_vocab_size": s.vocab.draft_vocab_size,
            "has_d2t": s.vocab.has_d2t,
            "has_t2d": s.vocab.has_t2d,
            "has_embed_tokens": s.has_embed_tokens,
            "has_lm_head": s.has_lm_head,
            "fc_norm": s.flags.fc_norm,
            "norm_output": s.flags.norm_output,
            "norm_before_fc": s.flags.norm_before_fc,
            "norm_before_residual": s.flags.norm_before_residual,
            "dtype": s.dtype,
            "num_parameters": s.num_parameters,
            "total_bytes": s.total_bytes,
            "files": s.files,
            "parallel_drafting": parallel_drafting(s),
            "serving": [dataclasses.asdict(support) for support in self.serving],
            "findings": [f.to_dict() for f in self.findings],
            "target": None if self.target is None else {
                "path": self.target.path, "num_layers": self.target.num_layers,
                "hidden_size": self.target.hidden_size, "vocab_size": self.target.vocab_size,
            },
        }
        if self.include_tensors:
            doc["tensors"] = [
                {"name": t.name, "source_name": t.source_name, "file": t.file, "dtype": t.dtype,
                 "shape": list(t.shape), "data_offsets": [t.data_start, t.data_end]}
                for t in s.tensors.values()
            ]
        return doc


def parallel_drafting(spec: DraftSpec) -> dict[str, Any] | None:
    """For a P-EAGLE draft (None otherwise): its mask slots, and its flags as written beside vLLM's reading of them
    at the latest release modelled (the speculators path drops the 3.1 flags, EK330/EK331)."""
    from eaglekit.engines import RECORDS, VLLM, vllm_view

    if not spec.facts.parallel_drafting:
        return None
    view = vllm_view(spec)
    mask = spec.tensors.get("mask_hidden")
    return {
        "method": "P-EAGLE",
        "mask_token_id": spec.facts.mask_token_id,
        "mask_hidden_shape": list(mask.shape) if mask is not None else None,
        "vllm": {
            "version": RECORDS[VLLM].latest,
            "settings": list(RECORDS[VLLM].settings(spec, spec.target)),
            "architecture": view.architecture,
            "parallel_token": view.parallel_token,
            "fc_norm": view.fc_norm,
            "norm_output": view.norm_output,
            "norm_before_fc": view.norm_before_fc,
            "norm_before_residual": view.norm_before_residual,
            "not_carried": list(view.not_carried),
        },
    }


@dataclass
class OtherDraftReport:
    """inspect's report for a draft of another speculative method: what it is and which vLLM method serves it."""

    path: str
    draft: OtherDraft

    def to_dict(self) -> dict[str, Any]:
        return {"path": self.path, "family": self.draft.family, "eagle3_draft": False,
                "speculative_method": self.draft.to_dict()}


def inspect_draft(
    source: str,
    *,
    subfolder: str | None = None,
    revision: str | None = None,
    target: str | None = None,
    allow_pickle: bool = False,
    family: str | None = None,
    include_tensors: bool = False,
) -> InspectReport | OtherDraftReport:
    """Read a draft (headers only), run the rules once over every engine, and show two views of that run: the
    file-level findings (no engine's own) and which engines can serve it as is. A draft of another speculative
    method is described instead (no EAGLE-3 rule applies to it)."""
    from eaglekit.families import load_draft
    from eaglekit.rules import all_rules, run_rules
    from eaglekit.serving import serving_support
    from eaglekit.target import read_target

    target_info = read_target(target) if target else None
    try:
        spec = load_draft(source, subfolder=subfolder, revision=revision, allow_pickle=allow_pickle,
                          family=family, target=target_info)
    except NotEagle3DraftError as exc:
        return OtherDraftReport(exc.path or source, exc.draft)
    report = run_rules(spec, target=target_info, engine="all", groups=("structure", "target", "engine"))
    engine_neutral = {r.code for r in all_rules() if r.engine is None}
    findings = [f for f in report.findings if f.code in engine_neutral]
    return InspectReport(spec, findings, serving_support(spec, target_info, report=report), target_info,
                         include_tensors)
