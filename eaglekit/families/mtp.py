"""Multi-token prediction (MTP) heads, served by vLLM's method mtp: most often inside the target checkpoint
itself (DeepSeek-V3 `num_nextn_predict_layers` with `model.layers.{L}.eh_proj/enorm/hnorm/shared_head`, GLM-4.5
likewise, Qwen3-Next and Qwen3.5 `mtp.*`, MiMo `model.mtp_layers.{i}.*`), or standalone: a speculators 0.9 MTP
draft (`speculators_model_type: mtp`, `num_nextn_predict_layers`, tensors `mtp_layers.0.*`;
speculators/models/mtp/) or a flat `*_mtp` config (vLLM 0.33.0 speculative.py MTPModelTypes, registry.py).
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from eaglekit.config_view import as_int, nested
from eaglekit.engines.vllm import (
    VLLM_MTP_COUNT_KEYS,
    VLLM_OTHER_METHODS_READ_AT,
    vllm_method_of,
    vllm_serves_mtp_of,
)
from eaglekit.errors import quoted
from eaglekit.families.base import Observed, family
from eaglekit.families.dflash import producer
from eaglekit.families.methods import Reading, architectures, describe, speculators_type
from eaglekit.io.checkpoint import MAX_DRAFT_TENSORS

if TYPE_CHECKING:
    from eaglekit.other_drafts import Form, OtherDraft

NAME = "mtp"
# layer L of DeepSeek-style targets: eh_proj joins the embedding and hidden state (enorm, hnorm their norms)
_LAYER_HEAD = re.compile(r"^(?:model\.)?layers\.(\d{1,9})\.(?:eh_proj|enorm|hnorm|shared_head)\.")
_MTP_MODULE = re.compile(r"^(?:model\.)?(?:mtp|mtp_layers)\.(?:(?:layers\.)?(\d{1,9})\.)?")
_DECODER_LAYER = re.compile(r"^(?:model\.)?(?:language_model\.)?(?:model\.)?layers\.(\d{1,9})\.")


@family(NAME, priority=5)
class Mtp:
    @staticmethod
    def matches(obs: Observed) -> bool:
        if speculators_type(obs) is not None:
            return speculators_type(obs) == "mtp"
        model_type = obs.config.get("model_type")
        standalone = vllm_method_of(list(architectures(obs))) == "mtp" or (
            isinstance(model_type, str) and (model_type == "mtp" or model_type.endswith("_mtp")))
        full_model_declaring = _declared_count(obs) and len(obs.names) > MAX_DRAFT_TENSORS
        return standalone or bool(_mtp_layers(obs)) or bool(full_model_declaring)

    @staticmethod
    def describe(obs: Observed) -> OtherDraft:
        found, declared = _mtp_layers(obs), _declared_count(obs)
        form: Form = "target checkpoint" if _in_target(obs, found) else (
            "speculators" if obs.speculators_layout else "flat")
        return describe(obs, NAME, Reading(
            "MTP", "multi-token prediction head", "mtp", _producer(obs, form), form=form,
            num_layers=declared or _count(found), method_config=VLLM_MTP_COUNT_KEYS,
            problem=_problem(obs, form, found, declared), notes=_notes(obs, form, found),
        ))


def _mtp_layers(obs: Observed) -> set[str]:
    """Where the MTP weights sit, e.g. {"model.layers.61"} or {"mtp"}."""
    found = set()
    for name in obs.names:
        if m := _LAYER_HEAD.match(name):
            found.add(name[: m.end(1)])
        elif m := _MTP_MODULE.match(name):
            found.add(name[: m.end(1) if m.group(1) else m.end() - 1])
    return found


def _count(found: set[str]) -> int | None:
    """MTP layers counted from where their weights sit: numbered modules, or one unnumbered `mtp` module."""
    numbered = [place for place in found if place[-1].isdigit()]
    return len(numbered) or (1 if found else None)


def _declared_count(obs: Observed) -> int | None:
    """The MTP layer count the config declares, where vLLM reads it (top level, text_config or mtp_config)."""
    for place in (obs.config, nested(obs.config, "text_config"), nested(obs.config, "mtp_config")):
        for key in VLLM_MTP_COUNT_KEYS:
            count = as_int(place.get(key))
            if count:
                return count
    return None


def _in_target(obs: Observed, found: set[str]) -> bool:
    """Decoder layers besides the MTP ones (or a full model's tensor count): the heads ride in a target."""
    if obs.speculators_layout:
        return False
    mtp_ids = {int(m.group(1)) for n in obs.names if (m := _LAYER_HEAD.match(n))}
    other = {int(m.group(1)) for n in obs.names if (m := _DECODER_LAYER.match(n))} - mtp_ids
    return bool(other) or len(obs.names) > MAX_DRAFT_TENSORS


def _producer(obs: Observed, form: Form) -> str:
    if form != "target checkpoint":
        return producer(obs, "mtp")
    model_type = obs.config.get("model_type")
    named = f"a {model_type} " if isinstance(model_type, str) and len(model_type) <= 40 else "a "
    return f"MTP layers inside {named}target checkpoint"


def _problem(obs: Observed, form: Form, found: set[str], declared: int | None) -> str | None:
    """Where vLLM would not serve these MTP heads as they are."""
    if form != "target checkpoint":
        return None
    if not vllm_serves_mtp_of(obs.config.get("model_type"), obs.config.get("architectures")):
        return (f"vLLM {VLLM_OTHER_METHODS_READ_AT} builds no MTP draft for model_type "
                f"{quoted(obs.config.get('model_type'))} (SpeculativeConfig.hf_config_override)")
    if declared and not found:
        return (f"the config declares {declared} MTP layer(s) but the checkpoint holds none of their tensors: vLLM's "
                "mtp method finds no weights to load")
    if found and not declared:
        return f"the config declares no MTP layer count ({', '.join(VLLM_MTP_COUNT_KEYS)}): vLLM builds no MTP layer"
    return None


def _notes(obs: Observed, form: Form, found: set[str]) -> tuple[str, ...]:
    notes = []
    if found:
        notes.append("MTP weights under " + ", ".join(sorted(found)[:4]) + (" ..." if len(found) > 4 else ""))
    if form == "target checkpoint":
        notes.append("served from the target itself: --speculative-config needs no draft model")
    return tuple(notes)
