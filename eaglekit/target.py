"""The facts validate and upgrade need from a target model's config.json (no weights read)."""

from __future__ import annotations

import os
from dataclasses import dataclass

from eaglekit.config_view import REPO_ID
from eaglekit.errors import CheckpointError
from eaglekit.io.jsonfile import check_inside, load_json_object, symlink_root


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
    max_position_embeddings: int | None = None
    name_or_path: str | None = None  # what the config records as its origin (often a Hub id)

    @property
    def default_aux_ids(self) -> tuple[int, ...]:
        """vLLM / EAGLE default capture list, input-of-layer: (2, L//2, L-3)."""
        L = self.num_layers
        return (2, L // 2, L - 3)


def _positive_int(text: dict, key: str, cfg_path: str) -> int:
    value = text.get(key)
    if key not in text:
        raise CheckpointError(f"target config lacks {key}", cfg_path)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise CheckpointError(f"target config: {key} must be a positive integer, not {value!r}"[:200], cfg_path)
    return value


def _strings(value, key: str, cfg_path: str) -> tuple[str, ...] | None:
    if value is None:
        return None
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise CheckpointError(f"target config: {key} must be a list of strings", cfg_path)
    return tuple(value)


TARGET_FILES = ["*.json", "*.safetensors", "*.model", "*.txt", "*.tiktoken", "*.jinja"]
"""What a target needs from the Hub: configs, weights and tokenizer files (no pickles, no other formats)."""


def resolve_target(value: str) -> str:
    """A target given as a local folder, its config.json, or a Hub id: the local path to read.

    A Hub id is read through the local Hugging Face cache, as a DRAFT is, and downloaded when it is not cached and
    the Hub is reachable. Anything that is not a Hub id and does not exist is a missing path."""
    if os.path.exists(value) or not REPO_ID.match(value):
        if not os.path.exists(value):
            raise CheckpointError("no such file or directory", value)
        return value
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError

    from eaglekit.io.hub_client import bounded_hub_client

    bounded_hub_client()
    try:
        return snapshot_download(value, allow_patterns=TARGET_FILES, local_files_only=True)
    except (LocalEntryNotFoundError, HfHubHTTPError, OSError, ValueError):
        pass
    try:
        return snapshot_download(value, allow_patterns=TARGET_FILES)
    except LocalEntryNotFoundError:
        raise CheckpointError("no local folder of that name, and the Hub id is not in the local Hugging Face cache "
                              "while the Hub is unreachable (offline?)", value) from None
    except (HfHubHTTPError, OSError, ValueError) as exc:
        raise CheckpointError(f"no local folder of that name, and the Hub download failed: "
                              f"{str(exc).splitlines()[0][:200]}", value) from None


def target_config_path(path: str) -> str:
    """A target is given as its model folder or its config.json."""
    return path if path.endswith(".json") else os.path.join(path, "config.json")


# llama.cpp's GGUF architecture names -> the Hugging Face model_type of the same family
GGUF_MODEL_TYPES = {"llama": "llama", "qwen2": "qwen2", "qwen3": "qwen3", "qwen3moe": "qwen3_moe",
                    "qwen3next": "qwen3_next", "qwen35": "qwen3_5", "qwen35moe": "qwen3_5_moe", "gemma3": "gemma3",
                    "gemma4": "gemma4", "minimax-m2": "minimax_m2", "gpt-oss": "gpt_oss", "deepseek2": "deepseek_v3",
                    "mistral3": "mistral3"}


def read_gguf_target(path: str) -> TargetInfo:
    """A target given as its GGUF file (what llama.cpp serves): L, T, V and the family from the metadata."""
    from eaglekit.io.gguf import read_gguf

    contents, _ = read_gguf(path)
    arch = contents.value("general.architecture")
    if not isinstance(arch, str):
        raise CheckpointError("GGUF without general.architecture", path)
    if arch == "eagle3":
        raise CheckpointError("this GGUF is an EAGLE-3 draft, not a target model", path)

    def positive(key: str) -> int:
        value = contents.value(f"{arch}.{key}")
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise CheckpointError(f"GGUF metadata {arch}.{key} must be a positive integer, not {value!r}"[:200], path)
        return value

    tokens = contents.fields.get("tokenizer.ggml.tokens")
    vocab = contents.value(f"{arch}.vocab_size") or (len(tokens.value) if tokens else None)
    if not isinstance(vocab, int) or vocab < 1:
        raise CheckpointError("GGUF has neither a vocab_size nor tokenizer.ggml.tokens", path)
    context = contents.value(f"{arch}.context_length")
    name = contents.value("general.name")
    model_type = GGUF_MODEL_TYPES.get(arch, arch)
    return TargetInfo(
        path=os.path.abspath(path), num_layers=positive("block_count"), hidden_size=positive("embedding_length"),
        vocab_size=vocab, tie_word_embeddings="output.weight" not in contents.tensors, architectures=(),
        model_type=model_type, max_position_embeddings=context if isinstance(context, int) and context > 0 else None,
        name_or_path=name if isinstance(name, str) else None,
    )


def read_target(path: str) -> TargetInfo:
    """A target's facts from its folder, its config.json, or its GGUF file."""
    if path.endswith(".gguf") and not os.path.isdir(path):
        return read_gguf_target(path)
    cfg_path = target_config_path(path)
    if not os.path.lexists(cfg_path):
        raise CheckpointError("target config not found (give a model directory or its config.json)", cfg_path)
    check_inside(cfg_path, symlink_root(os.path.dirname(os.path.abspath(cfg_path))), cfg_path)
    cfg = load_json_object(cfg_path, "target config")
    text = cfg.get("text_config") if isinstance(cfg.get("text_config"), dict) else cfg
    L, T, V = (_positive_int(text, k, cfg_path) for k in ("num_hidden_layers", "hidden_size", "vocab_size"))
    layer_types = _strings(text.get("layer_types"), "layer_types", cfg_path)
    if layer_types is not None and len(layer_types) != L:
        raise CheckpointError(f"target config: layer_types has {len(layer_types)} entries for {L} layers", cfg_path)
    max_pos = text.get("max_position_embeddings")
    name = cfg.get("_name_or_path")
    return TargetInfo(
        path=cfg_path,
        num_layers=L,
        hidden_size=T,
        vocab_size=V,
        tie_word_embeddings=bool(cfg.get("tie_word_embeddings", text.get("tie_word_embeddings", False))),
        architectures=_strings(cfg.get("architectures"), "architectures", cfg_path) or (),
        model_type=cfg.get("model_type") if isinstance(cfg.get("model_type"), str) else None,
        layer_types=layer_types,
        max_position_embeddings=max_pos if isinstance(max_pos, int) and not isinstance(max_pos, bool) and max_pos > 0
        else None,
        name_or_path=name if isinstance(name, str) else None,
    )
