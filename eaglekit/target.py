"""The facts validate and upgrade need from a target model's config.json, and the check that its weights cover
what that config builds (headers only, no tensor values read)."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from eaglekit.config_view import REPO_ID
from eaglekit.errors import CheckpointError
from eaglekit.io.checkpoint import INDEX_NAME, PICKLE_SUFFIXES, read_model_weights
from eaglekit.io.dtypes import FLOAT_DTYPES
from eaglekit.io.header import HeaderEntry
from eaglekit.io.jsonfile import check_inside, load_json_object, symlink_root

if TYPE_CHECKING:
    from eaglekit.quantization import DeclaredQuantization


@dataclass(frozen=True)
class TargetInfo:
    """The target model's facts a draft is checked against, from its config.json or its GGUF file's header."""

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
    derived_from: str | None = None  # how a local copy differs from that origin (DERIVED_FROM), e.g. dequantised
    quantization: DeclaredQuantization | None = None  # the numerics its quantization_config declares
    num_attention_heads: int | None = None  # as written (None: not written, or a GGUF target)

    @property
    def default_aux_ids(self) -> tuple[int, ...]:
        """vLLM / EAGLE default capture list, input-of-layer: (2, L//2, L-3)."""
        L = self.num_layers
        return (2, L // 2, L - 3)


GEOMETRY_LIMITS = {"num_hidden_layers": 4096, "hidden_size": 1 << 17, "vocab_size": 1 << 24,
                   "max_position_embeddings": 1 << 28, "intermediate_size": 1 << 20, "num_attention_heads": 1 << 12,
                   "num_key_value_heads": 1 << 12, "head_dim": 1 << 12}
"""Far above any released model (Llama-3.1-405B: 126 layers of width 16384, MLP width 53248, 128 heads of 128;
vocabularies up to 262 144 tokens; contexts up to 10M), far below what makes a size computation or an allocation
absurd."""
SIZES_WHERE_WRITTEN = ("intermediate_size", "num_attention_heads", "num_key_value_heads", "head_dim")
"""Sizes transformers allocates from when they are written (absent, it derives them)."""


def bounded_int(value, key: str, where: str, what: str = "target config", name: str | None = None) -> int:
    """`value` if it is an integer in [1, GEOMETRY_LIMITS[key]]; else one error line naming it (`name`, else
    `key`)."""
    limit = GEOMETRY_LIMITS[key]
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= limit:
        raise CheckpointError(f"{what}: {name or key} must be a positive integer at most {limit}, not {value!r}"[:200],
                              where)
    return value


def _positive_int(text: dict, key: str, cfg_path: str) -> int:
    if key not in text:
        raise CheckpointError(f"target config lacks {key}", cfg_path)
    return bounded_int(text[key], key, cfg_path)


def _strings(value, key: str, cfg_path: str) -> tuple[str, ...] | None:
    if value is None:
        return None
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise CheckpointError(f"target config: {key} must be a list of strings", cfg_path)
    return tuple(value)


TARGET_FILES = ["*.json", "*.safetensors", "*.model", "*.txt", "*.tiktoken", "*.jinja"]
"""What a target needs from the Hub: configs, weights and tokenizer files (no pickles, no other formats)."""


HUB_CACHE_SNAPSHOT = re.compile(r"(?:^|/)models--([^/]+?)--([^/]+)/snapshots/[^/]+(/.*)?$")
"""A path inside the Hugging Face cache: ORG, NAME and what follows the snapshot folder."""


def hub_id(target: TargetInfo) -> str | None:
    """The Hub id a target was given as: it is read from its Hugging Face cache folder (models--ORG--NAME); None for
    a local folder."""
    cached = HUB_CACHE_SNAPSHOT.search(os.path.abspath(target.path))
    return f"{cached.group(1)}/{cached.group(2)}" if cached else None


def resolve_target(value: str) -> str:
    """A target given as a local folder, its config.json, or a Hub id: the local path to read.

    A Hub id is read through the local Hugging Face cache, as a DRAFT is, and downloaded when it is not cached and
    the Hub is reachable. Anything that is not a Hub id and does not exist is a missing path."""
    if os.path.exists(value) or not REPO_ID.match(value):
        if not os.path.exists(value):
            raise CheckpointError("no such file or directory", value)
        return value
    from eaglekit.io.hub_client import HubFetchError, hub_snapshot

    try:
        return hub_snapshot(value, TARGET_FILES)
    except HubFetchError as exc:
        if exc.offline:
            raise CheckpointError("no local folder of that name, and the Hub id is not in the local Hugging Face "
                                  "cache while the Hub is unreachable (offline?)", value) from None
        raise CheckpointError(f"no local folder of that name, and the Hub download failed: {exc}", value) from None


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

    def metadata(key: str, limit_key: str, default=None) -> int | None:
        value = contents.value(f"{arch}.{key}", default)
        return bounded_int(value, limit_key, path, "GGUF metadata", f"{arch}.{key}") if value is not None else None

    tokens = contents.fields.get("tokenizer.ggml.tokens")
    vocab = metadata("vocab_size", "vocab_size", len(tokens.value) if tokens else None)
    if vocab is None:
        raise CheckpointError("GGUF has neither a vocab_size nor tokenizer.ggml.tokens", path)
    layers = metadata("block_count", "num_hidden_layers")
    if layers is None:
        raise CheckpointError(f"GGUF metadata lacks {arch}.block_count", path)
    hidden = metadata("embedding_length", "hidden_size")
    if hidden is None:
        raise CheckpointError(f"GGUF metadata lacks {arch}.embedding_length", path)
    _check_gguf_tensors(contents, layers, contents.value(f"{arch}.nextn_predict_layers", 0), path)
    name = contents.value("general.name")
    return TargetInfo(
        path=os.path.abspath(path), num_layers=layers, hidden_size=hidden, vocab_size=vocab,
        tie_word_embeddings="output.weight" not in contents.tensors, architectures=(),
        model_type=GGUF_MODEL_TYPES.get(arch, arch),
        max_position_embeddings=metadata("context_length", "max_position_embeddings"),
        name_or_path=name if isinstance(name, str) else None,
    )


def _check_gguf_tensors(contents, layers: int, extra_layers, path: str) -> None:
    """A GGUF's tensor table covers its metadata: blk.0..blk.{block_count-1} (plus any next-token-prediction
    blocks it declares), token_embd and output_norm; llama.cpp refuses such a file only when it loads it. A GGUF
    without tensors is read for its metadata alone, as a target folder with only its config is."""
    if not contents.tensors:
        return
    blocks = {int(m.group(1)) for m in map(re.compile(r"blk\.(\d+)\.").match, contents.tensors) if m}
    extra = extra_layers if isinstance(extra_layers, int) and not isinstance(extra_layers, bool) else 0
    _check_layers(blocks, layers, extra, "GGUF tensors", path)
    for name in ("token_embd.weight", "output_norm.weight"):
        if name not in contents.tensors:
            raise CheckpointError(f"GGUF has no {name} tensor", path)


DERIVED_FROM = "eaglekit_derived_from"
"""A target config key: how a local copy was made from the model `_name_or_path` names (a card says so)."""
MAX_DERIVED_CHARS = 200

DRAFT_KEYS = ("speculators_config", "eagle_config", "draft_vocab_size", "eagle_aux_hidden_state_layer_ids")


def _draft_sign(cfg: dict[str, Any]) -> str | None:
    """What marks a config as a draft's (a key only drafts write, or a draft architecture); None for a model."""
    key = next((k for k in DRAFT_KEYS if k in cfg), None)
    if key is not None:
        return f"its config has {key}"
    archs = cfg.get("architectures")
    arch = next((a for a in archs if isinstance(a, str) and ("Eagle" in a or "Speculator" in a)), None) \
        if isinstance(archs, list) else None
    return None if arch is None else f"architecture {arch}"


def read_target(path: str, *, weights: bool = False, decoder: bool = True) -> TargetInfo:
    """A target's facts from its folder, its config.json, or its GGUF file.

    Weights next to the config are read through the checked safetensors reader and must cover what the config
    builds (check_target_weights); `weights=True` (a target about to be loaded) also refuses a folder without any.
    `decoder=False` (a run that reads states from a store) asks only for the embeddings, final norm and lm_head:
    the decoder layers may be absent."""
    from eaglekit.quantization import declared_quantization

    if path.endswith(".gguf") and not os.path.isdir(path):
        return read_gguf_target(path)
    cfg_path = target_config_path(path)
    if not os.path.lexists(cfg_path):
        raise CheckpointError("target config not found (give a model directory or its config.json)", cfg_path)
    check_inside(cfg_path, symlink_root(os.path.dirname(os.path.abspath(cfg_path))), cfg_path)
    cfg = load_json_object(cfg_path, "target config")
    if (draft_sign := _draft_sign(cfg)) is not None:
        raise CheckpointError(f"this is an EAGLE draft ({draft_sign}), not a target model: --target takes the model "
                              "the draft was trained for", cfg_path)
    text_config = cfg.get("text_config")
    text: dict[str, Any] = text_config if isinstance(text_config, dict) else cfg
    L, T, V = (_positive_int(text, k, cfg_path) for k in ("num_hidden_layers", "hidden_size", "vocab_size"))
    for key in SIZES_WHERE_WRITTEN:
        if text.get(key) is not None:
            bounded_int(text[key], key, cfg_path)
    layer_types = _strings(text.get("layer_types"), "layer_types", cfg_path)
    if layer_types is not None and len(layer_types) != L:
        raise CheckpointError(f"target config: layer_types has {len(layer_types)} entries for {L} layers", cfg_path)
    max_pos = text.get("max_position_embeddings")
    tied = cfg.get("tie_word_embeddings", text.get("tie_word_embeddings", False))
    if not isinstance(tied, bool):
        raise CheckpointError(f"target config: tie_word_embeddings must be true or false, not {tied!r}"[:200], cfg_path)
    name = cfg.get("_name_or_path")
    info = TargetInfo(
        path=cfg_path,
        num_layers=L,
        hidden_size=T,
        vocab_size=V,
        tie_word_embeddings=tied,
        architectures=_strings(cfg.get("architectures"), "architectures", cfg_path) or (),
        model_type=cfg.get("model_type") if isinstance(cfg.get("model_type"), str) else None,
        layer_types=layer_types,
        max_position_embeddings=None if max_pos is None else bounded_int(max_pos, "max_position_embeddings",
                                                                          cfg_path),
        name_or_path=name if isinstance(name, str) else None,
        derived_from=derived[:MAX_DERIVED_CHARS] if isinstance(derived := cfg.get(DERIVED_FROM), str) else None,
        quantization=declared_quantization(cfg),
        num_attention_heads=text.get("num_attention_heads"),
    )
    check_target_weights(info, text.get("num_nextn_predict_layers"), required=weights, decoder=decoder,
                         quantized="quantization_config" in cfg or "quantization_config" in text)
    return info


EMBEDDINGS, FINAL_NORM, LM_HEAD = "embed_tokens.weight", "norm.weight", "lm_head.weight"


def head_names(info: TargetInfo) -> dict[str, tuple[str, Any]]:
    """role (embed, norm, lm_head) -> (file, header entry) of the target tensor that plays it, in its safetensors."""
    folder = os.path.dirname(os.path.abspath(info.path))
    entries = read_model_weights(folder, symlink_root(folder))
    embed = next((n for n in entries if n == EMBEDDINGS or n.endswith("." + EMBEDDINGS)), None)
    if embed is None:
        raise CheckpointError(f"target weights hold no {EMBEDDINGS}", folder)
    prefix = embed[: -len(EMBEDDINGS)]
    head = next((n for n in entries if n == LM_HEAD or n.endswith("." + LM_HEAD)), None)
    if head is None and not info.tie_word_embeddings:
        raise CheckpointError(f"target weights hold no {LM_HEAD} and the config does not tie it", folder)
    if prefix + FINAL_NORM not in entries:
        raise CheckpointError(f"target weights hold no final norm {prefix + FINAL_NORM}", folder)
    return {"embed": entries[embed], "norm": entries[prefix + FINAL_NORM], "lm_head": entries[head or embed]}


def head_digest(info: TargetInfo) -> str:
    """SHA-256 of the final norm and lm_head bytes: what turns id L into the target's tokens, and what tells apart
    two targets of one config and layout (a base model and its tune), whose weights fingerprints are equal."""
    import hashlib

    from eaglekit.io.writer import iter_file_chunks

    folder = os.path.dirname(os.path.abspath(info.path))
    digest, names = hashlib.sha256(), head_names(info)
    for role in ("norm", "lm_head"):
        rel, entry = names[role]
        digest.update(f"{role}\0{entry.dtype}\0{list(entry.shape)}\0".encode())
        for chunk in iter_file_chunks(os.path.join(folder, rel), entry.start, entry.end):
            digest.update(chunk)
    return "sha256:" + digest.hexdigest()


def check_target_weights(info: TargetInfo, extra_layers=None, *, required: bool = False, decoder: bool = True,
                         quantized: bool = False) -> None:
    """The safetensors next to the target's config, read through the checked reader (headers, index against
    shards, truncation), cover exactly what the config builds: every layer 0..L-1 (and no other, but the
    next-token-prediction layers a config declares), the embeddings [V, T], the final norm [T], and lm_head [V, T]
    unless tie_word_embeddings. transformers would fill a missing tensor with random values and still run; it
    would also cast integer weights to floats silently, so without a quantization_config every one is floating."""
    folder = os.path.dirname(os.path.abspath(info.path))
    names = os.listdir(folder)
    if INDEX_NAME not in names and not any(n.endswith(".safetensors") for n in names):
        if not required:
            return
        pickles = [n for n in names if n.endswith(PICKLE_SUFFIXES)]
        raise CheckpointError("cannot load the target model: " + (
            f"its weights are pickle files ({', '.join(pickles[:3])[:200]}), which eaglekit never unpickles; "
            "convert them to safetensors" if pickles else "no safetensors weights next to its config"), folder)
    entries = target_tensors(folder)
    V, T = info.vocab_size, info.hidden_size

    def fits(name: str, shape: tuple[int, ...]) -> bool:
        return name in entries and (entries[name].dtype not in FLOAT_DTYPES or entries[name].shape == shape)

    embeds = [n for n in entries if n == EMBEDDINGS or n.endswith("." + EMBEDDINGS)]
    embed = next((n for n in embeds if fits(n, (V, T))), None)
    if embed is None:
        raise CheckpointError(f"target weights: {embeds[0][:100]} is {list(entries[embeds[0]].shape)}, not the "
                              f"config's [vocab_size {V}, hidden_size {T}]" if embeds else
                              f"target weights hold no {EMBEDDINGS}: eaglekit loads decoder-only models laid out as "
                              "model.embed_tokens / model.layers.N / model.norm", folder)
    prefix = embed[: -len(EMBEDDINGS)]
    found = _layer_ids(entries, prefix)
    extra = extra_layers if isinstance(extra_layers, int) and not isinstance(extra_layers, bool) else 0
    if decoder or found:
        _check_layers(found, info.num_layers, extra, "target weights", folder)
    if not fits(prefix + FINAL_NORM, (T,)):
        raise CheckpointError(f"target weights hold no final norm {prefix + FINAL_NORM}[{T}]"[:300], folder)
    heads = [n for n in entries if n == LM_HEAD or n.endswith("." + LM_HEAD)]
    if not info.tie_word_embeddings and not any(fits(n, (V, T)) for n in heads):
        raise CheckpointError(f"target weights hold no {LM_HEAD} [{V}, {T}] and the config does not tie it to the "
                              "embeddings (tie_word_embeddings false): it would run with random values", folder)
    integer = next((n for n in entries if (n.startswith(prefix) or n in heads)
                    and entries[n].dtype not in FLOAT_DTYPES), None)
    if integer is not None and not quantized:
        raise CheckpointError(f"target weights: {integer[:100]} is {entries[integer].dtype}, not floating point, and "
                              "the config has no quantization_config to read it by", folder)


def _layer_ids(entries, prefix: str) -> set[int]:
    """The decoder layer ids among tensor names under `prefix` (what precedes embed_tokens.weight)."""
    layer = re.compile(re.escape(prefix) + r"layers\.(\d+)\.")
    return {int(m.group(1)) for m in map(layer.match, entries) if m}


def holds_decoder(info: TargetInfo, entries: dict[str, HeaderEntry]) -> bool:
    """Whether the target's folder (its `target_tensors`) holds its decoder layers: a store's reader needs only the
    embedding, final norm and lm_head, but a decode (the reference's or vLLM's) needs the whole target."""
    embed = next((n for n in entries if n == EMBEDDINGS or n.endswith("." + EMBEDDINGS)), EMBEDDINGS)
    return set(range(info.num_layers)) <= _layer_ids(entries, embed[: -len(EMBEDDINGS)])


def target_tensors(folder: str) -> dict[str, HeaderEntry]:
    """Every tensor's header entry in a target folder, through the checked reader (symlinks may point into a
    Hugging Face cache snapshot's blobs)."""
    return {name: entry for name, (_, entry) in read_model_weights(folder, symlink_root(folder)).items()}


def _check_layers(found: set[int], layers: int, extra: int, what: str, where: str) -> None:
    """Layer ids found in tensor names are exactly 0..layers-1, plus at most `extra` after them."""
    missing = sorted(set(range(layers)) - found)
    if missing:
        shown = ", ".join(map(str, missing[:5])) + (", …" if len(missing) > 5 else "")
        raise CheckpointError(f"{what} cover {layers - len(missing)} of the {layers} layers declared (missing layer "
                              f"{shown}): incomplete weights, or another model's", where)
    beyond = sorted(i for i in found if i >= layers + max(extra, 0))
    if beyond:
        raise CheckpointError(f"{what} hold layer {beyond[0]}" + (f" and {len(beyond) - 1} more" if beyond[1:] else "")
                              + f" beyond the {layers} declared: another model's weights?", where)
