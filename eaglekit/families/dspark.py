"""DSpark block drafters: a DFlash backbone plus a low-rank Markov logit-bias head (and a confidence head), served by
vLLM's method dspark. DeepSeek-V4.1 ships its DSpark stages inside the target checkpoint, under `mtp.*`.

Forms: speculators 0.9 (`speculators_model_type: dspark`, `markov_rank`, `markov_head_type`,
`enable_confidence_head`, `aux_hidden_state_layer_ids`, `block_size`; speculators/models/dspark/config.py,
algos.update_dspark in vLLM 0.33.0), the flat form (`architectures: ["Qwen3DSparkModel"]` or `["DSparkDraftModel"]`
with `model_type: qwen3`, `dspark_block_size` / `block_size`, `dspark_target_layer_ids` / `target_layer_ids`,
`dspark_noise_token_id` / `mask_token_id`; tensors `markov_head.markov_w1`, `markov_head.markov_w2`,
`confidence_head.*`; vLLM 0.33.0 qwen3_dspark.py) and the DeepSeek-V4.1 target (`model_type: deepseek_v41`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from eaglekit.engines.vllm import vllm_method_of
from eaglekit.families.base import Observed, family
from eaglekit.families.dflash import producer
from eaglekit.families.methods import (
    Reading,
    architectures,
    block_mask_token,
    describe,
    int_value,
    speculators_type,
)

if TYPE_CHECKING:
    from eaglekit.other_drafts import OtherDraft

NAME = "dspark"
CONFIG_MARKS = ("markov_rank", "dspark_block_size", "dspark_target_layer_ids", "dspark_noise_token_id")
SETTINGS = ("markov_rank", "markov_head_type", "enable_confidence_head", "confidence_head_with_markov",
            "sample_from_anchor", "dspark_bonus_anchor", "dspark_draft_topk", "draft_vocab_size")
IN_TARGET_MODEL_TYPE = "deepseek_v41"  # speculative.py: "V4.1 ... ships DSpark stages under mtp.*"


@family(NAME, priority=2)
class DSpark:
    @staticmethod
    def matches(obs: Observed) -> bool:
        if speculators_type(obs) is not None:
            return speculators_type(obs) == "dspark"
        return (vllm_method_of(list(architectures(obs))) == "dspark" or any("DSpark" in a for a in architectures(obs))
                or any(key in obs.config for key in CONFIG_MARKS) or _in_target(obs)
                or any(n.startswith(("markov_head.", "model.markov_head.")) for n in obs.names))

    @staticmethod
    def describe(obs: Observed) -> OtherDraft:
        in_target = _in_target(obs)
        return describe(obs, NAME, Reading(
            "DSpark", "block drafter", "dspark",
            "DSpark stages inside a DeepSeek-V4.1 target checkpoint (mtp.*)" if in_target else producer(obs, "dspark"),
            form="target checkpoint" if in_target else None,
            block_size=int_value(obs, "block_size", "dspark_block_size", "dflash_config.block_size"),
            num_layers=int_value(obs, "num_nextn_predict_layers") if in_target else None,
            mask_token_id=block_mask_token(obs), method_config=SETTINGS,
        ))


def _in_target(obs: Observed) -> bool:
    return obs.config.get("model_type") == IN_TARGET_MODEL_TYPE and any(".mtp." in f".{n}" for n in obs.names)
