"""DFlash2 block drafters: DFlash with grouped local convolutions and a low-rank candidate selector. vLLM serves
them under method dflash (algos.update_dflash2 maps speculators `dflash2` to it).

Forms: speculators 0.9 (`speculators_model_type: dflash2`, `conv_kernel_size`, `conv_group_size`, `selector_rank`,
`selector_top_k` top-level; speculators/models/dflash2/config.py) and the flat z-lab form (`architectures:
["DFlash2DraftModel"]`, those keys and `block_size`, `mask_token_id`, `target_layer_ids` inside `dflash_config`;
tensors `candidate_selector.*`, `layers.{i}.attention_conv.*`, `layers.{i}.mlp_conv.*`; z-lab/dflash
tests/fixtures/dflash2-config.json and dflash2-safetensors-header.json).
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

NAME = "dflash2"
SELECTOR_KEYS = ("conv_kernel_size", "conv_group_size", "selector_rank", "selector_top_k")
SETTINGS = SELECTOR_KEYS + tuple(f"dflash_config.{k}" for k in SELECTOR_KEYS) + (
    "sliding_window_non_causal", "sample_from_anchor", "draft_vocab_size")
TENSOR_MARKS = ("candidate_selector.", ".attention_conv.", ".mlp_conv.")


@family(NAME, priority=3)
class DFlash2:
    @staticmethod
    def matches(obs: Observed) -> bool:
        if speculators_type(obs) is not None:
            return speculators_type(obs) == "dflash2"
        flat_keys = obs.config.get("dflash_config")
        return (vllm_method_of(list(architectures(obs))) == "dflash2" or any("DFlash2" in a for a in architectures(obs))
                or (isinstance(flat_keys, dict) and "selector_rank" in flat_keys)
                or any(mark in n for n in obs.names for mark in TENSOR_MARKS))

    @staticmethod
    def describe(obs: Observed) -> OtherDraft:
        return describe(obs, NAME, Reading(
            "DFlash2", "block drafter", "dflash2", producer(obs, "dflash2"),
            block_size=int_value(obs, "block_size", "dflash_config.block_size"),
            mask_token_id=block_mask_token(obs), method_config=SETTINGS,
        ))
