"""The facts validate and upgrade need from a target model's config.json (no weights read)."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass

from eaglekit.errors import CheckpointError


@dataclass(frozen=True)
class TargetInfo:
    path: str
    num_layers: int  # L
    hidden_size: int  # T
    vocab_size: int  # V
    tie_word_embeddings: bool
    architectures: tuple[str, ...]
    model_type: str | None
    layer_types: tuple[str, ...] | None = None  # hybrid targets (P21)

    @property
    def default_aux_ids(self) -> tuple[int, ...]:
        """vLLM / EAGLE default capture list, input-of-layer: (2, L//2, L-3)."""
        L = self.num_layers
        return (2, L // 2, L - 3)


def read_target(path: str) -> TargetInfo:
    cfg_path = path if path.endswith(".json") else os.path.join(path, "config.json")
    try:
        with open(cfg_path, encoding="utf-8") as fh:
            cfg = json.load(fh)
    except FileNotFoundError:
        raise CheckpointError("target config not found (give a model directory or its config.json)", cfg_path) from None
    except (OSError, json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise CheckpointError(f"cannot read target config ({exc})".splitlines()[0], cfg_path) from None
    if not isinstance(cfg, dict):
        raise CheckpointError("target config is not a JSON object", cfg_path)
    text = cfg.get("text_config") if isinstance(cfg.get("text_config"), dict) else cfg
    try:
        L, T, V = int(text["num_hidden_layers"]), int(text["hidden_size"]), int(text["vocab_size"])
    except (KeyError, TypeError, ValueError):
        raise CheckpointError("target config lacks num_hidden_layers / hidden_size / vocab_size", cfg_path) from None
    layer_types = text.get("layer_types")
    return TargetInfo(
        path=cfg_path,
        num_layers=L,
        hidden_size=T,
        vocab_size=V,
        tie_word_embeddings=bool(cfg.get("tie_word_embeddings", text.get("tie_word_embeddings", False))),
        architectures=tuple(cfg.get("architectures") or ()),
        model_type=cfg.get("model_type"),
        layer_types=tuple(layer_types) if isinstance(layer_types, list) else None,
    )
