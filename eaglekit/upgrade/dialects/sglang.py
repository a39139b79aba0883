"""SGLang's flat layout: ids only in eagle_config, in the convention SGLang's target model applies (§5.1, §5.5).

SGLang's Llama-family targets add 1 to every id; its DeepSeek/Kimi targets add 1 only when the first id is 1.
So the same physical layers are written as output-of-layer ids for the former and unchanged for the latter
(the target's model_type decides when a target is given, else the draft's attention kind).
A single-layer Llama draft uses SGLang's own `midlayer.` names.
"""

from __future__ import annotations

from typing import Any

from eaglekit.catalogue import output_name
from eaglekit.engines import DEEPSEEK_TARGET_TYPES
from eaglekit.errors import UsageError
from eaglekit.spec import DraftSpec
from eaglekit.target import TargetInfo
from eaglekit.upgrade import folder
from eaglekit.upgrade.decide import Decisions
from eaglekit.upgrade.dialects import NO_PARALLEL_DRAFTING, NO_QWEN3_CLASS
from eaglekit.upgrade.dialects.flat import flat_config
from eaglekit.upgrade.vocab import VocabPlan

NAME = "sglang"
ENGINE = "sglang"
FINETUNE_READS = False
ONE_FILE = False  # a folder whose weights --max-shard-size splits into shards
CANNOT_WRITE: dict[str, str] = {
    "qwen3": NO_QWEN3_CLASS,
    "parallel_drafting": NO_PARALLEL_DRAFTING,
    "norm_before_residual": "this draft uses norm_before_residual true, and SGLang has no such switch (it always "
                            "behaves as false): it cannot be served faithfully there (P12)",
}
CAVEATS: dict[str, str] = {}
WRITER = folder
ARCHITECTURES = {"llama": "LlamaForCausalLMEagle3", "mla": "Eagle3DeepseekV2ForCausalLM"}


def deepseek_target(spec: DraftSpec, d: Decisions) -> bool:
    """Whether SGLang's DeepSeek/Kimi target path reads the ids (the target decides; else the draft's attention)."""
    if d.target is not None and d.target.model_type:
        return d.target.model_type in DEEPSEEK_TARGET_TYPES
    return spec.attention == "mla"


def read_family(spec: DraftSpec, d: Decisions) -> str:
    """The family that reads the written ids back in the convention they were written in."""
    return "vllm" if deepseek_target(spec, d) else "sglang"


def sglang_ids(spec: DraftSpec, d: Decisions) -> list[int]:
    ids = d.aux.ids
    if deepseek_target(spec, d):
        if ids[0] == 1:
            raise UsageError("aux layer ids starting at 1 (vLLM convention) cannot be written for SGLang's "
                             "DeepSeek/Kimi target path, which shifts a list starting at 1 by one")
        return list(ids)
    if ids[0] == 0:
        raise UsageError("aux layer id 0 (the embedding output) cannot be written for SGLang, which adds 1 to every id")
    return [i - 1 for i in ids]


def config(spec: DraftSpec, d: Decisions, vocab: VocabPlan) -> dict[str, Any]:
    cfg = flat_config(spec, d, vocab, ARCHITECTURES[spec.attention])
    eagle: dict[str, Any] = {"eagle_aux_hidden_state_layer_ids": sglang_ids(spec, d),
                             "use_aux_hidden_state": True}
    if d.norm_before_fc:
        eagle["norm_before_fc"] = True
    cfg["eagle_config"] = eagle
    return cfg


def tensor_name(canonical: str, spec: DraftSpec) -> str | None:
    return output_name(canonical, NAME, spec)


def refusal(spec: DraftSpec, d: Decisions, target: TargetInfo | None) -> str | None:
    return None
