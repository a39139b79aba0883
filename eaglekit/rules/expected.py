"""The exact tensor set a draft's geometry and flags call for (reference §3.1, §3.4, §10 items 8-12), read from
the tensor catalogue, and the quantisation tensors beside its weights.

vLLM's eagle3 loaders never report a missing tensor (P5), so this set is what every check compares against.
"""

from __future__ import annotations

from dataclasses import dataclass

from eaglekit.catalogue import CACHE_SCALES, WEIGHT_COMPANIONS, is_rotary_buffer
from eaglekit.catalogue import TensorExpectation as TensorExpectation
from eaglekit.catalogue import tensor_expectations as tensor_expectations
from eaglekit.spec import DraftSpec

ROW_INDEXED = ("weight_scale", "weight_zero_point")  # may hold one entry (or block) per weight row
COLUMN_INDEXED = ("weight_g_idx",)  # one entry per input column: a row transform leaves it as it is
ROW_TRANSFORMED = ("lm_head.weight",)  # the weights whose rows upgrade may move (sorting a frequency-ordered d2t)
QUANTISED_WEIGHT_DTYPES = ("I8", "U8", "F4")  # int8 and packed 4-bit weights, beside their scales
SCALED_WEIGHT_DTYPES = QUANTISED_WEIGHT_DTYPES + ("F8_E4M3", "F8_E5M2")  # stored values that mean nothing unscaled
SCALED_METHODS = ("compressed-tensors", "compressed_tensors", "modelopt", "modelopt_fp4", "modelopt_mxfp8",
                  "modelopt_mixed")
"""quant_methods whose linear layers each create a `weight_scale` parameter (besides every method naming fp8)."""
SCALE_DTYPES = ("BF16", "F16", "F32", "F64", "F8_E4M3", "F8_E5M2", "F8_E8M0")
INDEX_DTYPES = ("I8", "U8", "I32", "U32", "I64")  # zero points and group indices


def quantization_config(spec: DraftSpec) -> dict | None:
    """The draft's quantization_config: top level, or in a speculators transformer_layer_config (where the
    speculators dialect writes it, beside the layer it describes)."""
    layer = spec.config.get("transformer_layer_config")
    for cfg in (spec.config, layer if isinstance(layer, dict) else {}):
        if isinstance(cfg.get("quantization_config"), dict):
            return cfg["quantization_config"]
    return None


def expected_tensors(spec: DraftSpec) -> dict[str, tuple[int | None, ...]]:
    """The vLLM-ready name -> shape set for this draft: every required tensor plus the optional ones it holds."""
    return {e.name: e.shape for e in tensor_expectations(spec) if e.required or e.name in spec.tensors}


def tolerated_extra(spec: DraftSpec, name: str) -> bool:
    """Names vLLM's loader drops by itself, and the quantisation tensors of a draft that declares its quantisation
    (their own problems are EK158's)."""
    return is_rotary_buffer(name) or quant_companion(spec, name) is not None


@dataclass(frozen=True)
class QuantCompanion:
    """A quantisation tensor beside a weight: how a transform of that weight's rows must treat it."""

    name: str
    weight: str | None  # the weight it belongs to (None: an attention-cache scale, or none found)
    follows_rows: bool  # one entry (or block row) per weight row: it moves with them; otherwise copied as is
    problem: str | None  # why no conversion can carry it faithfully (None: it can)


def _companion_dtypes(suffix: str) -> tuple[str, ...]:
    if suffix in COLUMN_INDEXED:
        return INDEX_DTYPES
    return INDEX_DTYPES + SCALE_DTYPES if "zero_point" in suffix else SCALE_DTYPES


def quant_companion(spec: DraftSpec, name: str) -> QuantCompanion | None:
    """The quantisation tensor `name` is, in a draft with a quantization_config; None for any other tensor.
    Each is either carried completely by upgrade, or has a `problem` that validate reports and upgrade refuses."""
    module, _, suffix = name.rpartition(".")
    if quantization_config(spec) is None or suffix not in WEIGHT_COMPANIONS + CACHE_SCALES:
        return None
    ref = spec.tensors[name]
    shape = list(ref.shape)
    if suffix in CACHE_SCALES:
        fine = module.endswith(".self_attn") and ref.numel == 1 and ref.dtype in SCALE_DTYPES
        return QuantCompanion(name, None, False, None if fine else
                              f"{name} {ref.dtype} {shape} is not one floating-point scale of an attention module")
    weight = f"{module}.weight"
    base = spec.tensors.get(weight)
    if base is None:
        return QuantCompanion(name, None, False, f"{name} belongs to no weight: there is no {weight}")
    if ref.dtype not in _companion_dtypes(suffix):
        return QuantCompanion(name, weight, False, f"{name} is {ref.dtype}, not a {suffix} dtype "
                                                   f"({', '.join(_companion_dtypes(suffix))})")
    if suffix in ROW_INDEXED and ref.numel > 1 and base.shape and shape and shape[0] == base.shape[0]:
        return QuantCompanion(name, weight, True, None)
    row_free = ref.numel == 1 or (suffix in COLUMN_INDEXED and len(base.shape) == 2 and shape == [base.shape[1]])
    if row_free or weight not in ROW_TRANSFORMED:
        return QuantCompanion(name, weight, False, None)  # one value, per column, or of a weight only ever copied
    return QuantCompanion(name, weight, False, f"{name} {shape} is neither one value nor one entry per row of {weight} "
                                               f"{list(base.shape)}, so it cannot follow those rows when the "
                                               "vocabulary map is sorted")


def needs_weight_scale(spec: DraftSpec) -> bool:
    """Whether the draft's quant_method scales each quantised weight by its own `weight_scale`. vLLM's fp8 method
    (any quant_method naming fp8 reads as an fp8-serialised checkpoint) registers `weight_scale` for every linear
    layer, initialised to float32's lowest value until the checkpoint's tensor is loaded; compressed-tensors and
    ModelOpt schemes register one likewise."""
    qcfg = quantization_config(spec)
    method = qcfg.get("quant_method") if qcfg is not None else None
    return isinstance(method, str) and ("fp8" in method.lower() or method.lower() in SCALED_METHODS)


def unscaled_weights(spec: DraftSpec) -> list[str]:
    """Quantised weights (fp8, int8, packed 4-bit) with no `weight_scale` beside them, in a draft whose
    quant_method needs one: the engine multiplies by a scale nothing loaded."""
    if not needs_weight_scale(spec):
        return []
    return [name for name, ref in sorted(spec.tensors.items())
            if name.endswith(".weight") and ref.dtype in SCALED_WEIGHT_DTYPES
            and f"{name.removesuffix('.weight')}.weight_scale" not in spec.tensors]


def quant_companions(spec: DraftSpec) -> list[QuantCompanion]:
    return [c for name in sorted(spec.tensors) if (c := quant_companion(spec, name)) is not None]


def shape_matches(actual: tuple[int, ...], expected: tuple[int | None, ...]) -> bool:
    return len(actual) == len(expected) and all(e is None or a == e for a, e in zip(actual, expected))


def format_shape(shape: tuple[int | None, ...]) -> str:
    return "[" + ", ".join("?" if d is None else str(d) for d in shape) + "]"
