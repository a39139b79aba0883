"""XPress block drafters: a DFlash drafter plus a causal low-rank refiner head resolved with parallel Jacobi passes.
vLLM serves them under method dflash (SpeculativeConfig.is_xpress: "XPress serves under method=dflash").

Forms: speculators 0.9 (`speculators_model_type: xpress`, `xpress_rank`, `xpress_mlp_ratio`, `num_jacobi_passes`;
tensors `refiner_head.*`; speculators/models/xpress/) — which vLLM 0.33.0's speculators path does not read — and the
flat form vLLM loads (`architectures: ["Qwen3XPressModel"]`, `xpress_block_size`, `xpress_rank`,
`xpress_mlp_hidden`, `xpress_topc`, `dflash_config`; tensors `xpress_head.*`; vLLM 0.33.0 qwen3_xpress.py).
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

NAME = "xpress"
CONFIG_MARKS = ("xpress_rank", "xpress_block_size", "xpress_topc")
SETTINGS = ("xpress_rank", "xpress_mlp_hidden", "xpress_mlp_ratio", "xpress_topc", "num_jacobi_passes",
            "sample_from_anchor", "draft_vocab_size")


@family(NAME, priority=1)
class XPress:
    @staticmethod
    def matches(obs: Observed) -> bool:
        if speculators_type(obs) is not None:
            return speculators_type(obs) == "xpress"
        return (vllm_method_of(list(architectures(obs))) == "xpress" or any("XPress" in a for a in architectures(obs))
                or any(key in obs.config for key in CONFIG_MARKS)
                or any(n.startswith(("xpress_head.", "refiner_head.")) for n in obs.names))

    @staticmethod
    def describe(obs: Observed) -> OtherDraft:
        return describe(obs, NAME, Reading(
            "XPress", "block drafter", "xpress", producer(obs, "xpress"),
            block_size=int_value(obs, "xpress_block_size", "block_size", "dflash_config.block_size"),
            mask_token_id=block_mask_token(obs), method_config=SETTINGS,
        ))
