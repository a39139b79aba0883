"""PARD parallel draft models: a small causal LM of the target's family, trained to fill K mask tokens in one pass.
vLLM serves it as a draft model with parallel drafting on; its proposer reads the mask token from `pard_token`.

Form: the base model's own config plus `pard_token` and `spd_type: "pard"` (AMD-AGI/PARD pard/pard_train.py writes
both), tensors of an ordinary causal LM (`model.embed_tokens`, `model.layers.{i}.*`, `model.norm`, `lm_head`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from eaglekit.config_view import as_int
from eaglekit.engines.vllm import VLLM_EAGLE3_CLASSES
from eaglekit.families.base import Observed, family
from eaglekit.families.methods import Reading, architectures, describe

if TYPE_CHECKING:
    from eaglekit.other_drafts import OtherDraft

NAME = "pard"


@family(NAME, priority=6)
class Pard:
    @staticmethod
    def matches(obs: Observed) -> bool:
        marked = as_int(obs.config.get("pard_token")) is not None or obs.config.get("spd_type") == "pard"
        eagle_like = any(a in VLLM_EAGLE3_CLASSES or "eagle" in a.lower() for a in architectures(obs))
        return marked and not eagle_like and not obs.speculators_layout

    @staticmethod
    def describe(obs: Observed) -> OtherDraft:
        archs = architectures(obs)
        return describe(obs, NAME, Reading(
            "PARD", "parallel draft model", "pard",
            f"PARD causal LM, {archs[0][:60]}" if archs else "PARD causal LM",
            mask_token_id=as_int(obs.config.get("pard_token")), method_config=("spd_type",),
            notes=("without parallel_drafting vLLM runs it as an ordinary draft model, one token per pass",),
        ))
