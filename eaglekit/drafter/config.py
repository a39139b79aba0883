"""The drafter's configuration: what vLLM derives from a draft checkpoint (geometry, K, vocabularies, flags).

Kept apart from the torch module so that a configuration can be read, overridden and compared without torch.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from eaglekit.errors import CheckpointError, UsageError
from eaglekit.spec import DraftSpec, MlaGeometry

OVERRIDABLE_FLAGS = ("fc_norm", "norm_output", "norm_before_fc", "norm_before_residual")


@dataclass(frozen=True)
class DrafterConfig:
    """Everything the step needs to know about a draft; built from a DraftSpec or written by hand (training)."""

    hidden_size: int  # H
    target_hidden_size: int  # T
    intermediate_size: int  # I
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    num_aux_hidden_states: int  # K
    vocab_size: int  # V
    draft_vocab_size: int  # Vd
    attention: str = "llama"  # llama | qwen3 | mla
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_scaling: Mapping[str, Any] | None = None
    attention_bias: bool = False
    sliding_windows: tuple[int | None, ...] | None = None  # per layer; None: full attention everywhere
    mla: MlaGeometry | None = None
    fc_norm: bool = False
    norm_output: bool = False
    norm_before_fc: bool = False
    norm_before_residual: bool = False
    use_aux_hidden_state: bool = True  # False: no fc, the target's last state is used as is
    logit_scale: float = 1.0
    source: str | None = None  # checkpoint path, for error messages

    @classmethod
    def from_spec(cls, spec: DraftSpec, overrides: Mapping[str, bool] | None = None,
                  vocab_size: int | None = None) -> DrafterConfig:
        """The configuration vLLM derives from this checkpoint, with optional flag overrides."""
        g = spec.geometry
        layer_cfg = spec.config.get("transformer_layer_config") if spec.config_layout == "speculators" else None
        layer_cfg = layer_cfg if isinstance(layer_cfg, dict) else spec.config
        vocab = spec.vocab.vocab_size or vocab_size
        if vocab is None:
            raise CheckpointError("vocabulary size unknown (no vocab_size, no embed_tokens): "
                                  "pass the target's embedding", spec.path)
        target_hidden = g.target_hidden
        written_eagle_config = spec.config.get("eagle_config")
        eagle_config = written_eagle_config if isinstance(written_eagle_config, dict) else {}
        mla = spec.attention == "mla"  # vLLM's MLA class always has fc and never input_norm
        use_aux = mla or bool(eagle_config.get("use_aux_hidden_state", True))
        k = spec.num_aux_hidden_states
        fc = spec.tensors.get("fc.weight")
        if fc is not None and len(fc.shape) == 2:
            if fc.shape[1] % target_hidden:
                raise CheckpointError(f"fc.weight fan-in {fc.shape[1]} is not a multiple of the target hidden size "
                                      f"{target_hidden}; load the draft with its target to learn T", spec.path)
            k = fc.shape[1] // target_hidden
        nbr = spec.flags.norm_before_residual
        if nbr is None:
            nbr = bool(spec.facts.norm_before_residual_default)
        config = cls(
            hidden_size=g.hidden_size,
            target_hidden_size=target_hidden,
            intermediate_size=g.intermediate_size,
            num_layers=g.num_layers,
            num_heads=g.num_heads,
            num_kv_heads=g.num_kv_heads or g.num_heads,
            head_dim=g.head_dim,
            num_aux_hidden_states=k or 3,
            vocab_size=vocab,
            draft_vocab_size=spec.vocab.draft_vocab_size or vocab,
            attention=spec.attention,
            rms_norm_eps=g.rms_norm_eps,
            rope_theta=g.rope_theta,
            rope_scaling=g.rope_scaling,
            attention_bias=g.attention_bias,
            sliding_windows=_windows(layer_cfg, g.num_layers, g.sliding_window),
            mla=g.mla,
            fc_norm=spec.flags.fc_norm,
            norm_output=spec.flags.norm_output,
            norm_before_fc=spec.flags.norm_before_fc and not mla,
            norm_before_residual=nbr,
            use_aux_hidden_state=use_aux,
            logit_scale=float(spec.config.get("logit_scale", 1.0) or 1.0),
            source=spec.path,
        )
        return config.with_overrides(overrides)

    def with_overrides(self, overrides: Mapping[str, bool] | None) -> DrafterConfig:
        """Flip flags to test a hypothesis (e.g. "was this trained with norm_output?") without touching files."""
        if not overrides:
            return self
        unknown = sorted(set(overrides) - set(OVERRIDABLE_FLAGS))
        if unknown:
            raise UsageError(f"unknown drafter override(s) {', '.join(unknown)}; known: {', '.join(OVERRIDABLE_FLAGS)}")
        flags: dict[str, Any] = {k: bool(v) for k, v in overrides.items()}
        return dataclasses.replace(self, **flags)


def _windows(layer_cfg: Mapping[str, Any], layers: int, window: int | None) -> tuple[int | None, ...] | None:
    """Per-layer sliding windows: `layer_types` decides per layer when written, else one window for all."""
    types = layer_cfg.get("layer_types")
    size = layer_cfg.get("sliding_window")
    if isinstance(types, list) and isinstance(size, int):
        return tuple(size if i < len(types) and types[i] == "sliding_attention" else None for i in range(layers))
    return (window,) * layers if window else None
