"""The speculators layout (reference §4.7): a transformer_layer_config plus top-level EAGLE-3 fields.

vLLM starts the draft config from transformer_layer_config, so K (num_aux_hidden_states) goes there too (P11);
norm_before_residual is always explicit because this path defaults it to true (P12).
"""

from __future__ import annotations

import os
from typing import Any

from eaglekit.catalogue import output_name
from eaglekit.spec import DraftSpec
from eaglekit.target import TargetInfo, hub_id
from eaglekit.upgrade import folder
from eaglekit.upgrade.decide import Decisions
from eaglekit.upgrade.dialects.flat import carried_keys, dtype_keys, geometry_keys, source_layer_config
from eaglekit.upgrade.vocab import VocabPlan

NAME = "speculators"
ENGINE = "vllm"
FINETUNE_READS = False
ONE_FILE = False  # a folder whose weights --max-shard-size splits into shards
CANNOT_WRITE: dict[str, str] = {
    "parallel_drafting": "the source is a P-EAGLE draft: this dialect writes speculators' eagle3 layout, and vLLM's "
                         "reading of speculators' own P-EAGLE layout drops fc_norm and norm_output (EK330, EK331): "
                         "write --to vllm",
    "mla": "MLA drafts cannot be written in the speculators layout (vLLM maps only llama and qwen3 there, P31): use "
           "--to vllm or --to sglang",
}
CAVEATS: dict[str, str] = {"eagle31": "the speculators layout carries the 3.1 flags only for vLLM >= 0.25.0 (P9)"}
WRITER = folder
FORMAT_VERSION = "0.9.0"  # the speculators release whose config layout this follows
LAYER_ARCHITECTURES = {"llama": "LlamaForCausalLM", "qwen3": "Qwen3ForCausalLM"}
TOP_LEVEL_ONLY = ("draft_vocab_size", "target_hidden_size")


def read_family(spec: DraftSpec, d: Decisions) -> str:
    return "speculators"


def _source_verifier(spec: DraftSpec) -> dict[str, Any] | None:
    source = spec.config.get("speculators_config")
    verifier = source.get("verifier") if isinstance(source, dict) else None
    return dict(verifier) if isinstance(verifier, dict) and verifier.get("name_or_path") else None


def _verifier(spec: DraftSpec, d: Decisions) -> dict[str, Any]:
    """The verifier speculators loads the embedding, lm_head and final norm from (`load_verifier_weights`): the
    source's, else the target as given (a Hub id, or its folder), as speculators' own converter writes it."""
    recorded = _source_verifier(spec)
    if recorded is not None:
        return recorded
    assert d.target is not None  # refusal() requires one
    return {"name_or_path": hub_id(d.target) or os.path.dirname(os.path.abspath(d.target.path)),
            "architectures": list(d.target.architectures)}


def _speculators_config(spec: DraftSpec, d: Decisions) -> dict[str, Any]:
    source = spec.config.get("speculators_config")
    if isinstance(source, dict) and source.get("algorithm") == "eagle3":
        return {**source, "verifier": _verifier(spec, d)}
    return {
        "algorithm": "eagle3",
        "default_proposal_method": "greedy",
        "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": 3}],
        "verifier": _verifier(spec, d),
    }


def config(spec: DraftSpec, d: Decisions, vocab: VocabPlan) -> dict[str, Any]:
    layer: dict[str, Any] = {"architectures": [LAYER_ARCHITECTURES[spec.attention]], "model_type": spec.attention}
    layer.update({k: v for k, v in carried_keys(spec).items() if k not in ("torch_dtype", "dtype")})
    geometry = geometry_keys(spec, d, vocab)
    layer.update({k: v for k, v in geometry.items() if k not in TOP_LEVEL_ONLY})
    layer["num_aux_hidden_states"] = d.num_aux
    cfg: dict[str, Any] = {
        "architectures": ["Eagle3Speculator"],
        "speculators_model_type": "eagle3",
        "speculators_version": FORMAT_VERSION,
        "speculators_config": _speculators_config(spec, d),
        "transformer_layer_config": layer,
        "draft_vocab_size": vocab.draft_vocab_size,
        "target_hidden_size": d.target_hidden,
        "eagle_aux_hidden_state_layer_ids": list(d.aux.ids),
        "norm_before_residual": d.norm_before_residual,
        "norm_before_fc": d.norm_before_fc,
        "fc_norm": d.fc_norm,
        "norm_output": d.norm_output,
        "embed_requires_grad": bool(source_layer_config(spec).get("embed_requires_grad", False)),
    }
    cfg.update(dtype_keys(spec, d))
    return cfg


def tensor_name(canonical: str, spec: DraftSpec) -> str | None:
    return output_name(canonical, NAME, spec)


def refusal(spec: DraftSpec, d: Decisions, target: TargetInfo | None) -> str | None:
    if _source_verifier(spec) is not None:
        return None
    if target is None:
        return ("speculators loads the verifier's embedding, lm_head and norm from speculators_config.verifier, which "
                "the source does not record: pass --target (a Hub id or the target's folder)")
    if hub_id(target) is None:
        d.warnings.append("speculators_config.verifier names the local target folder (speculators loads the "
                          "verifier's embedding, lm_head and norm from it): give --target as a Hub id before "
                          "publishing this output")
    return None
