"""vLLM's flat HF layout (reference §10): ids in vLLM convention both top-level and in eagle_config."""

from __future__ import annotations

from typing import Any

from eaglekit.catalogue import output_name
from eaglekit.spec import DraftSpec
from eaglekit.target import TargetInfo
from eaglekit.upgrade import folder
from eaglekit.upgrade.decide import Decisions
from eaglekit.upgrade.dialects.flat import flat_config
from eaglekit.upgrade.vocab import VocabPlan

NAME = "vllm"
ENGINE = "vllm"
FINETUNE_READS = True  # `eaglekit finetune` trains drafts in this layout
ONE_FILE = False  # a folder whose weights --max-shard-size splits into shards
CANNOT_WRITE: dict[str, str] = {}
CAVEATS: dict[str, str] = {}
WRITER = folder
ARCHITECTURES = {"llama": "LlamaForCausalLMEagle3", "qwen3": "Eagle3Qwen3ForCausalLM",
                 "mla": "Eagle3DeepseekV2ForCausalLM"}


def read_family(spec: DraftSpec, d: Decisions) -> str:
    return "peagle" if spec.facts.parallel_drafting else "vllm"


def config(spec: DraftSpec, d: Decisions, vocab: VocabPlan) -> dict[str, Any]:
    cfg = flat_config(spec, d, vocab, ARCHITECTURES[spec.attention])
    ids = list(d.aux.ids)
    cfg["eagle_aux_hidden_state_layer_ids"] = ids  # V2 runner, speculators
    eagle = {"eagle_aux_hidden_state_layer_ids": ids, "use_aux_hidden_state": True}  # K for the classes, V1 runner
    if d.norm_before_fc:
        eagle["norm_before_fc"] = True
    cfg["eagle_config"] = eagle
    if spec.facts.parallel_drafting:  # the mask-slot token under the name vLLM's own P-EAGLE mapping gives it
        cfg.pop("mask_token_id", None)
        cfg["pard_token"] = spec.facts.mask_token_id
    return cfg


def tensor_name(canonical: str, spec: DraftSpec) -> str | None:
    return output_name(canonical, NAME, spec)


def refusal(spec: DraftSpec, d: Decisions, target: TargetInfo | None) -> str | None:
    return None
