"""DFlash block drafters (z-lab DFlash, speculators `dflash`, and the DFlash-backbone variants vLLM serves under
method dflash: LiLiCorr, Muse Glimmer's assistant, Laguna). Never an EAGLE-3 draft, though its `fc`, `hidden_norm`
and `layers.{i}.` tensors look like one.

Forms: speculators 0.9 (`speculators_model_type: dflash`, `aux_hidden_state_layer_ids`, `block_size`,
`mask_token_id` top-level; speculators/models/dflash/config.py) and the flat z-lab form (`architectures:
["DFlashDraftModel"]`, top-level `block_size`, `dflash_config: {mask_token_id, target_layer_ids}`,
`num_target_layers`; z-lab/dflash model/dflash.py, the z-lab/Qwen3-4B-DFlash-b16 config).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from eaglekit.engines.vllm import vllm_method_of
from eaglekit.families.base import Observed, family
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

NAME = "dflash"
SETTINGS = ("dflash_config.causal", "sliding_window_non_causal", "sample_from_anchor", "dflash_config.use_swa",
            "draft_vocab_size", "target_hidden_size")


@family(NAME, priority=4)
class DFlash:
    @staticmethod
    def matches(obs: Observed) -> bool:
        if speculators_type(obs) is not None:
            return speculators_type(obs) == "dflash"
        return (vllm_method_of(list(architectures(obs))) == "dflash" or obs.config.get("model_type") == "dflash"
                or any("DFlash" in a for a in architectures(obs)) or isinstance(obs.config.get("dflash_config"), dict))

    @staticmethod
    def describe(obs: Observed) -> OtherDraft:
        return describe(obs, NAME, Reading(
            "DFlash", "block drafter", "dflash", producer(obs, "dflash"),
            block_size=int_value(obs, "block_size", "dflash_config.block_size"),
            mask_token_id=block_mask_token(obs), method_config=SETTINGS,
        ))


def producer(obs: Observed, speculators_kind: str) -> str:
    """Who wrote the config: speculators (with its version), or the flat form and its architecture."""
    if speculators_type(obs) == speculators_kind:
        version = obs.config.get("speculators_version")
        return f"speculators {version} config" if isinstance(version, str) and len(version) <= 40 else \
            "speculators config"
    archs = architectures(obs)
    return f"flat config, {archs[0][:60]}" if archs else "flat config"
