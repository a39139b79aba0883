"""What the families of other speculative methods share: the form a checkpoint takes, the config values they read
(in the producer's speculators form or its flat form), and the assembly of their description."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from eaglekit.config_view import as_ids, as_int, nested
from eaglekit.engines.vllm import (
    VLLM_DRAFT_METHODS,
    VLLM_OTHER_METHODS_READ_AT,
    VLLM_SPECULATORS_MODEL_TYPES,
    VLLM_TARGET_LAYER_KEYS,
)
from eaglekit.families.base import Observed

if TYPE_CHECKING:  # a description is built only for a draft of another method: loaded then
    from eaglekit.other_drafts import Form, Kind, OtherDraft, TargetLayers, VllmServing

_LAYER = re.compile(r"^(?:model\.)?layers\.(\d{1,9})\.")
MAX_CONFIG_TEXT = 80  # a method's own string values are shown; a longer one is not a setting anyone reads


def speculators_type(obs: Observed) -> str | None:
    """speculators_model_type of a speculators-form config (speculators 0.9: eagle3, dflash, dspark, ...)."""
    value = obs.config.get("speculators_model_type")
    return value if obs.speculators_layout and isinstance(value, str) else None


def architectures(obs: Observed) -> tuple[str, ...]:
    archs = obs.config.get("architectures")
    return tuple(a for a in archs if isinstance(a, str)) if isinstance(archs, list) else ()


def config_value(obs: Observed, *keys: str) -> Any:
    """The first value written under `keys` ("a.b" reads inside object a), at the top level first, then in the
    speculators form's transformer_layer_config."""
    for cfg in (obs.config, obs.layer_config):
        for key in keys:
            head, _, tail = key.partition(".")
            value = nested(cfg, head).get(tail) if tail else cfg.get(key)
            if value is not None:
                return value
    return None


def int_value(obs: Observed, *keys: str) -> int | None:
    return as_int(config_value(obs, *keys))


def decoder_layers(obs: Observed) -> int | None:
    """Draft decoder layers: counted from the tensor names, else the config's num_hidden_layers."""
    ids = {int(m.group(1)) for n in obs.names if (m := _LAYER.match(n))}
    return len(ids) if ids else int_value(obs, "num_hidden_layers")


def target_layers(obs: Observed) -> TargetLayers | None:
    """The target layers as written, and the hidden_states indices vLLM captures for them (its speculators path
    copies aux_hidden_state_layer_ids to eagle_aux_hidden_state_layer_ids, as is)."""
    from eaglekit.other_drafts import TargetLayers

    keys = (("aux_hidden_state_layer_ids", 0),) if speculators_type(obs) else ()
    for key, shift in keys + VLLM_TARGET_LAYER_KEYS:
        written = as_ids(config_value(obs, key))
        if written is not None:
            if key == "dspark_target_layer_ids" and obs.config.get("model_type") == "deepseek_v41":
                shift = 0
            return TargetLayers(written, key, tuple(i + shift for i in written))
    return None


def method_settings(obs: Observed, keys: tuple[str, ...]) -> dict[str, Any]:
    """The method's own config values that are written as plain numbers, flags or short names."""
    found: dict[str, Any] = {}
    for key in keys:
        value, short = config_value(obs, key), key.rpartition(".")[2]
        plain = isinstance(value, (bool, int, float)) or (isinstance(value, str) and len(value) <= MAX_CONFIG_TEXT)
        if plain and short not in found:
            found[short] = value
    return found


def serving(method_key: str, obs: Observed, problem: str | None = None) -> VllmServing:
    """How vLLM serves the method; a speculators form its speculators path cannot read is the problem."""
    from eaglekit.other_drafts import VllmServing

    facts = VLLM_DRAFT_METHODS[method_key]
    kind = speculators_type(obs)
    if problem is None and kind is not None and kind not in VLLM_SPECULATORS_MODEL_TYPES:
        problem = (f"vLLM {VLLM_OTHER_METHODS_READ_AT}'s speculators path reads speculators_model_type "
                   f"{', '.join(sorted(VLLM_SPECULATORS_MODEL_TYPES))}, not {kind!r}: it refuses this config")
    return VllmServing(facts.method, facts.since, VLLM_OTHER_METHODS_READ_AT, dict(facts.settings), problem)


@dataclass(frozen=True)
class Reading:
    """What a method's family read that the shared assembly cannot know."""

    method: str
    kind: Kind
    method_key: str  # VLLM_DRAFT_METHODS key
    producer: str
    form: Form | None = None  # None: speculators or flat, from the config
    block_size: int | None = None
    num_layers: int | None = None
    mask_token_id: int | None = None
    method_config: tuple[str, ...] = ()  # config keys of the method's own settings
    problem: str | None = None
    notes: tuple[str, ...] = ()


def describe(obs: Observed, family: str, reading: Reading) -> OtherDraft:
    from eaglekit.other_drafts import OtherDraft

    form: Form = reading.form or ("speculators" if obs.speculators_layout else "flat")
    model_type = obs.config.get("model_type")
    return OtherDraft(
        family=family,
        method=reading.method,
        kind=reading.kind,
        form=form,
        producer=reading.producer,
        architectures=architectures(obs),
        model_type=model_type if isinstance(model_type, str) else None,
        vllm=serving(reading.method_key, obs, reading.problem),
        block_size=reading.block_size,
        num_layers=decoder_layers(obs) if reading.num_layers is None else reading.num_layers,
        target_layers=target_layers(obs),
        num_target_layers=int_value(obs, "num_target_layers", "dflash_config.num_target_layers"),
        mask_token_id=reading.mask_token_id,
        method_config=method_settings(obs, reading.method_config),
        num_tensors=len(obs.names),
        notes=reading.notes,
    )


def block_mask_token(obs: Observed) -> int | None:
    """The token a block drafter fills its block with, where vLLM looks for it (llm_base_proposer)."""
    return int_value(obs, "dflash_config.mask_token_id", "mask_token_id", "dspark_noise_token_id")
