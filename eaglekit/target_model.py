"""The target (verifier) model: a Hugging Face causal LM that also hands out aux hidden states.

Aux ids follow vLLM's convention: id i (0 <= i < L) is the residual stream entering decoder layer i, id L is
the final state *before* the model's last norm. They are captured with forward pre-hooks on the decoder
layers and on the final norm, so the answer does not depend on how a transformers version fills
`output_hidden_states` (whose last entry is post-norm in some versions).
"""

from __future__ import annotations

import inspect
import os
import re
import warnings
from collections.abc import Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, cast

from eaglekit.errors import CheckpointError, UsageError
from eaglekit.io.dtypes import FLOAT_DTYPES
from eaglekit.quantization import Scheme, quantize_linear_layers, refuse_emulation_on_declared, scheme
from eaglekit.target import TargetInfo, read_target, target_tensors

DTYPES = ("auto", "float32", "bfloat16", "float16", "float64")
QUANTIZED_DTYPE = "float64"
"""What `auto` means for a target with served numerics: the emulation's own arithmetic must add no rounding. In
float32 a chunked pass (verification) and a one-token pass differ by an ULP before a format's rounding, which flips
an FP8 rounding about once in five tokens and makes the target disagree with itself; in float64 it never did."""
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")


@dataclass
class TargetPass:
    """One target forward: logits, the requested aux states (ascending id order) and the updated cache."""

    logits: Any  # [B, S, V] (or the last `logits_to_keep` positions)
    aux: list  # [B, S, T] per id in sorted(set(aux_ids))
    past: Any  # the HF cache, updated in place


def resolve_dtype(dtype: str, device: str):
    """torch dtype for a --dtype name; "auto" is bfloat16 on CUDA and float32 elsewhere."""
    import torch

    if dtype not in DTYPES:
        raise UsageError(f"unknown dtype {dtype!r}; use one of {', '.join(DTYPES)}")
    if dtype == "auto":
        return torch.bfloat16 if str(device).startswith("cuda") else torch.float32
    return getattr(torch, dtype)


DEVICE_NAME = re.compile(r"auto|cpu|cuda(?::\d+)?")


def check_device(device: str) -> None:
    """--device as resolve_device reads it: a misspelt one is refused with the other options, before torch loads
    (whether CUDA is there is asked of torch, when the target loads)."""
    if not DEVICE_NAME.fullmatch(device):
        raise UsageError(f"--device {device!r}: unknown device; use auto, cpu or cuda[:N]")


def resolve_device(device: str) -> str:
    """cpu, cuda[:N], or auto: the first CUDA device when there is one, else the CPU."""
    check_device(device)
    import torch

    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise UsageError(f"--device {device}: no CUDA device is available")
    return device


def _decoder_parts(model) -> tuple[Sequence[Any], Any, Any]:
    """(decoder layers, final norm, input embedding module) of a decoder-only HF model."""
    base = model.get_decoder() if hasattr(model, "get_decoder") else getattr(model, "model", None)
    layers = getattr(base, "layers", None)
    norm = getattr(base, "norm", None)
    if layers is None or norm is None:
        raise CheckpointError(f"{type(model).__name__}: no decoder `layers` and final `norm` to capture aux states "
                              "from")
    return layers, norm, model.get_input_embeddings()


class TargetModel:
    """A loaded target plus aux-state capture; `forward` is the only entry point the decode loop needs."""

    def __init__(self, model, tokenizer, *, path: str, device: str, dtype, context: int | None = None,
                 quantization: Scheme | None = None):
        self.model = model
        self.quantization = quantization  # the served numerics its linear layers compute with (None: full precision)
        self.tokenizer = tokenizer
        self.path = path
        self.device = device
        self.dtype = dtype
        self.context = context  # max_position_embeddings: positions the target was trained on (None: not stated)
        layers, norm, embed = _decoder_parts(model)
        self.num_layers = len(layers)
        self.hidden_size = int(embed.weight.shape[1])
        self.vocab_size = int(model.get_output_embeddings().weight.shape[0])
        self.embed_tokens = embed.weight
        self.lm_head = model.get_output_embeddings().weight
        self.tied = self.lm_head.data_ptr() == self.embed_tokens.data_ptr()
        self._wanted: frozenset[int] = frozenset()
        self._captured: dict[int, Any] = {}
        for index, layer in enumerate(layers):
            layer.register_forward_pre_hook(self._capture_hook(index), with_kwargs=True)
        norm.register_forward_pre_hook(self._capture_hook(self.num_layers), with_kwargs=True)
        params = inspect.signature(model.forward).parameters
        self._cache_kwarg = "cache" if "cache" in params else "past_key_values"

    def _capture_hook(self, index: int):
        def hook(module, args, kwargs):
            if index in self._wanted:
                self._captured[index] = args[0] if args else kwargs["hidden_states"]

        return hook

    @property
    def eos_token_ids(self) -> frozenset[int]:
        """Every id that ends a generation (config and tokenizer may name different ones)."""
        ids: set[int] = set()
        for source in (getattr(self.model, "generation_config", None), self.model.config):
            value = getattr(source, "eos_token_id", None) if source is not None else None
            if isinstance(value, int):
                ids.add(value)
            elif isinstance(value, (list, tuple)):
                ids.update(v for v in value if isinstance(v, int))
        if self.tokenizer is not None and isinstance(getattr(self.tokenizer, "eos_token_id", None), int):
            ids.add(self.tokenizer.eos_token_id)
        return frozenset(ids)

    def new_cache(self):
        """An empty KV cache for `forward(past=...)`."""
        from transformers import DynamicCache

        try:
            return DynamicCache(config=self.model.config)
        except TypeError:
            return DynamicCache()

    @staticmethod
    def cache_length(past) -> int:
        return int(past.get_seq_length()) if past is not None else 0

    @staticmethod
    def crop(past, length: int) -> None:
        """Roll the cache back to its first `length` positions (rejected draft tokens are dropped)."""
        remove = TargetModel.cache_length(past) - length
        if remove < 0:
            raise ValueError(f"cannot crop a cache of {length + remove} positions to {length}")
        if remove:
            # A negative argument removes that many positions in every transformers version.
            past.crop(-remove)

    def check_aux_ids(self, aux_ids: Sequence[int]) -> tuple[int, ...]:
        ids = tuple(sorted(set(int(i) for i in aux_ids)))
        bad = [i for i in ids if not 0 <= i <= self.num_layers]
        if bad:
            raise UsageError(f"aux layer ids {bad} are outside [0, {self.num_layers}] for this target "
                             f"(L={self.num_layers})", self.path)
        return ids

    def forward(self, input_ids, aux_ids: Sequence[int] = (), past=None, *, logits_to_keep: int = 0) -> TargetPass:
        """Run the target on `input_ids` [B, S] after the positions already in `past` (None: a fresh cache).

        `logits_to_keep` > 0 returns logits for only the last that many positions (prefill of long prompts).
        """
        import torch

        ids = self.check_aux_ids(aux_ids)
        if past is None:
            past = self.new_cache()
        self._wanted, self._captured = frozenset(ids), {}
        try:
            with torch.inference_mode():
                out = self.model(
                    input_ids=input_ids.to(self.device),
                    use_cache=True,
                    logits_to_keep=logits_to_keep,
                    **{self._cache_kwarg: past},
                )
            aux = [self._captured[i] for i in ids]
        finally:
            self._wanted, self._captured = frozenset(), {}
        return TargetPass(out.logits, aux, past)


SUPPORTED = ("decoder-only causal LMs with model.embed_tokens / model.layers / model.norm (Llama, Mistral, Qwen, "
             "Gemma, ...)")


@contextmanager
def quiet_transformers():
    """Nothing transformers logs, warns or draws reaches the terminal while a target loads: eaglekit says what went
    wrong in one line of its own."""
    from transformers.utils import logging as hf_logging

    previous = hf_logging.get_verbosity()
    hf_logging.set_verbosity(hf_logging.CRITICAL + 1)
    hf_logging.disable_progress_bar()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        hf_logging.set_verbosity(previous)


def _check_architecture(path: str, model_type: str | None):
    """The target's config as transformers reads it, refused unless transformers builds a causal LM of it whose
    decoder eaglekit can hook; decided on an empty (meta-device) model, before any weight is read."""
    import torch
    import transformers
    from transformers import AutoConfig, AutoModelForCausalLM
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    version = f"transformers {transformers.__version__}"
    if model_type is None:
        raise CheckpointError(f"target config names no model_type; eaglekit loads {SUPPORTED}", path)
    if model_type not in CONFIG_MAPPING_NAMES:
        raise CheckpointError(f"target model_type {model_type!r} is not one {version} knows (custom model code is "
                              f"never run); eaglekit loads {SUPPORTED}"[:400], path)
    if model_type not in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES:
        raise CheckpointError(f"target model_type {model_type!r} has no causal-LM class in {version}; eaglekit loads "
                              f"{SUPPORTED}", path)
    try:
        config = AutoConfig.from_pretrained(path)
        with torch.device("meta"):
            skeleton = AutoModelForCausalLM.from_config(config)
    except Exception as exc:  # noqa: BLE001 -- transformers raises many types (even AssertionError) for a config
        detail = str(exc).splitlines()[0][:160] if str(exc) else type(exc).__name__
        raise CheckpointError(f"{version} cannot build a {model_type} model from the target's config ({detail}); "
                              f"eaglekit loads {SUPPORTED}", path) from None
    try:
        _decoder_parts(skeleton)
    except CheckpointError:
        raise CheckpointError(f"target architecture {type(skeleton).__name__} (model_type {model_type}) is not "
                              f"supported: eaglekit loads {SUPPORTED}", path) from None
    return config, skeleton


def _check_shapes(skeleton, path: str) -> None:
    """Every stored float tensor has the shape the config builds for it, compared before anything is allocated
    (transformers would stop on the first with a pointer to a report it printed)."""
    built = {name: tuple(value.shape) for name, value in skeleton.state_dict().items()}
    wrong = sorted((name, entry.shape) for name, entry in target_tensors(path).items()
                   if name in built and entry.dtype in FLOAT_DTYPES and entry.shape != built[name])
    if wrong:
        (name, stored), more = wrong[0], f" (and {len(wrong) - 1} more)" if len(wrong) > 1 else ""
        raise CheckpointError(f"target weights: {name[:100]} is {list(stored)} but the config builds "
                              f"{list(built[name])} for {type(skeleton).__name__}{more}: another model's weights or "
                              "config?", path)


def _refuse_initialised(cls: str, missing: list[str], path: str) -> None:
    """Refuse a model transformers had to complete with random values (a tensor the weights do not hold under any
    name it converts)."""
    if missing:
        shown = ", ".join(missing[:3])[:200] + (", …" if len(missing) > 3 else "")
        raise CheckpointError(f"target weights lack {len(missing)} tensor(s) {cls} needs ({shown}): they would run "
                              "with random values", path)


def load_tokenizer(path: str, info: TargetInfo):
    """The target folder's tokenizer (None where it has none), carrying the target's context as `model_max_length`:
    every prompt is bounded by it (decode.prompts.encode)."""
    if not any(os.path.isfile(os.path.join(path, name)) for name in TOKENIZER_FILES):
        return None
    with quiet_transformers():
        from transformers import AutoTokenizer

        try:
            tokenizer = AutoTokenizer.from_pretrained(path)
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise CheckpointError(f"cannot load the target tokenizer ({exc})".splitlines()[0][:400], path) from None
    if info.max_position_embeddings is not None:
        tokenizer.model_max_length = info.max_position_embeddings
    return tokenizer


def _refuse_non_finite(model, path: str) -> None:
    """Refuse, naming the first, a floating weight holding NaN or ±Inf as loaded (a corrupt file, or a value past
    the range of the dtype asked for): the target would decode garbage and every draft would look lossless against
    it. One reduction per tensor; the element-wise test runs only to confirm an overflowing sum."""
    import torch

    with torch.no_grad():
        for name, weight in model.named_parameters():
            if weight.is_floating_point() and not torch.isfinite(weight.sum(dtype=torch.float32)) \
                    and not bool(torch.isfinite(weight).all()):
                raise CheckpointError(f"target weight {name[:100]} holds NaN or infinite values (as "
                                      f"{str(weight.dtype).removeprefix('torch.')}): a corrupt or badly converted "
                                      "checkpoint", path)


def served_16bit_dtype(config):
    """The 16-bit dtype a quantized checkpoint of this target keeps its scales in: the one its config declares,
    bfloat16 when it declares none or float32 (the dtype vLLM then serves it in; its weight-only kernels run 16-bit)."""
    import torch

    declared = getattr(config, "dtype", None) or getattr(config, "torch_dtype", None)
    return torch.float16 if declared in (torch.float16, "float16") else torch.bfloat16


def load_target(path: str, *, device: str = "cpu", dtype: str = "float32",
                quantization: str | None = None) -> TargetModel:
    """Load a local HF causal LM directory (safetensors only; nothing is unpickled) on `device` in `dtype`;
    with `quantization` (eaglekit.quantization.SCHEMES) its decoder's linear layers compute as that format serves.

    Its config and weights are checked first (read_target with weights: every tensor the config builds is there,
    no file is truncated), then its architecture on an empty model; a tensor transformers would still have to
    initialise is refused after loading, so no target ever runs with random weights."""
    served = scheme(quantization)
    if served is not None and dtype == "auto":
        dtype = QUANTIZED_DTYPE
    device = resolve_device(device)  # torch, then transformers: a missing install is said before any file is read
    torch_dtype = resolve_dtype(dtype, device)
    import transformers

    if not os.path.isdir(path):
        raise CheckpointError("target is not a directory (give a local Hugging Face model folder)", path)
    if not os.path.isfile(os.path.join(path, "config.json")):
        raise CheckpointError("target has no config.json", path)
    info = read_target(path, weights=True)
    refuse_emulation_on_declared(quantization, info)

    with quiet_transformers():
        config, skeleton = _check_architecture(path, info.model_type)
        _check_shapes(skeleton, path)
        try:
            # transformers types from_pretrained as returning the model alone; output_loading_info adds the info
            model, loading = cast(tuple[Any, dict[str, list[str]]], transformers.AutoModelForCausalLM.from_pretrained(
                path, config=config, dtype=torch_dtype, use_safetensors=True, output_loading_info=True))
        except (OSError, ValueError, KeyError, RuntimeError) as exc:
            raise CheckpointError(f"cannot load the target model ({exc})".splitlines()[0][:400], path) from None
        _refuse_initialised(type(model).__name__, sorted(loading.get("missing_keys") or ()), path)
        _refuse_non_finite(model, path)
        model.to(device).eval()
    if served is not None:
        quantize_linear_layers(_decoder_parts(model)[0], served.name, served_16bit_dtype(config))
    tokenizer = load_tokenizer(path, info)
    return TargetModel(model, tokenizer, path=path, device=device, dtype=torch_dtype,
                       context=info.max_position_embeddings, quantization=served)
