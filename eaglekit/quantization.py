"""The target as it is served: its linear layers run with a quantized format's numerics (fake quantization).

Drafters are trained on full-precision hidden states, but production targets are served in FP8, NVFP4 or with
INT8 / INT4 weights, and acceptance moves with the target's numerics. `--target-quantization S` makes the reference
target compute as the served one does: every linear layer of its decoder (attention and MLP projections; not the
embedding or lm_head, which serving stacks keep in 16 bits) has its weights rounded to the format once, and, for
W+A schemes, its input rounded at every call. Values are rounded exactly as the format defines them and multiplied
back by their scales in float32, so the matmul sees precisely the representable values (what a kernel that
dequantizes computes, up to its accumulation order).

Schemes (each as its format's specification writes it):

- ``fp8``: OCP 8-bit floating point, E4M3 "FN" encoding (OCP OFP8 Formats for Deep Learning v1.0, 2023: 1 sign,
  4 exponent bits with bias 7, 3 mantissa bits, no infinities, largest finite 448, round to nearest even,
  saturating). Weights: one FP32 scale per output channel (amax / 448); activations: one dynamic scale per token
  (amax over the hidden dimension / 448). This is the W8A8 "FP8 dynamic" scheme of compressed-tensors
  checkpoints served by vLLM.
- ``nvfp4``: NVIDIA NVFP4 (NVIDIA Blackwell 5th-gen Tensor Core block-scaled formats; "Pretraining Large Language
  Models with NVFP4", arXiv 2509.25149, section 2): E2M1 elements (magnitudes 0, 0.5, 1, 1.5, 2, 3, 4, 6), one
  FP8 E4M3 scale per block of 16 consecutive elements along the reduction dimension, and an FP32 second-level
  scale per tensor chosen so the largest block scale maps to 448: global = amax / (6 · 448), block scale =
  E4M3(block amax / 6 / global), element = E2M1(x / (block scale · global)). Weights and activations; an
  activation's second-level scale is taken per token (dynamic; a served checkpoint carries a calibrated static one),
  so a token's numerics never depend on the other tokens in its batch.
- ``int8``: weight-only INT8, symmetric, one scale per output channel (amax / 127), round half to even, range
  [-128, 127] (the W8A16 per-channel scheme of GPTQ / compressed-tensors).
- ``int4``: weight-only INT4, symmetric, one scale per group of 128 input elements (amax / 7), round half to
  even, range [-8, 7] (GPTQ with sym=True, group_size=128; compressed-tensors W4A16 "pack-quantized").

The weight-only formats keep their scales in the model's 16-bit dtype (compressed-tensors writes them so and vLLM
loads them so) and their kernels dequantise into it: vLLM's CPU W4A16 kernel computes (q - 8) · scale in float32
and rounds that to bf16 / fp16 before the matmul (to nearest even, as here; its bf16 path for CPUs without AMX
may round toward zero, engine arithmetic this reference does not follow). So a scale is rounded to the target's
16-bit dtype before the weights are divided by it, and every dequantised weight is rounded to that dtype too.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from eaglekit.errors import UsageError, quoted

E4M3_MAX = 448.0
E2M1_MAX = 6.0
E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
E2M1_TIES_UP = (False, True, False, True, False, True, False)
"""Between neighbouring E2M1 values, whether a tie rounds up: ties go to the even mantissa (0, 1, 2, 4 are even;
0.5, 1.5, 3, 6 odd), so 0.25 -> 0, 0.75 -> 1, 1.25 -> 1, 1.75 -> 2, 2.5 -> 2, 3.5 -> 4, 5 -> 4."""
NVFP4_BLOCK = 16
INT4_GROUP = 128


@dataclass(frozen=True)
class Scheme:
    """A served numeric format: how it quantizes weights and activations, and where it is specified."""

    name: str
    weights: str
    activations: str | None  # None: weight-only, activations stay in the target's dtype
    reference: str

    def to_dict(self) -> dict[str, Any]:
        return {"scheme": self.name, "weights": self.weights, "activations": self.activations,
                "specification": self.reference, "layers": "decoder linear layers (not embeddings or lm_head)"}

    @property
    def label(self) -> str:
        return f"{self.name} (weights {self.weights}; activations {self.activations or 'unquantized'})"


SCHEMES = {
    "fp8": Scheme("fp8", "FP8 E4M3, per-output-channel FP32 scale", "FP8 E4M3, dynamic per-token FP32 scale",
                  "OCP OFP8 v1.0 (E4M3 FN)"),
    "nvfp4": Scheme("nvfp4", "NVFP4: E2M1, E4M3 scale per 16 elements, FP32 scale per tensor",
                    "NVFP4: E2M1, E4M3 scale per 16 elements, dynamic FP32 scale per token",
                    "NVIDIA NVFP4 (arXiv 2509.25149)"),
    "int8": Scheme("int8", "INT8 symmetric, per-output-channel scale in the model's 16-bit dtype", None,
                   "GPTQ / compressed-tensors W8A16"),
    "int4": Scheme("int4", "INT4 symmetric, scale per group of 128 inputs in the model's 16-bit dtype", None,
                   "GPTQ sym, group_size 128 / compressed-tensors W4A16"),
}


def scheme(name: str | None) -> Scheme | None:
    if name is None:
        return None
    if name not in SCHEMES:
        raise UsageError(f"--target-quantization {name!r}: use one of {', '.join(SCHEMES)}")
    return SCHEMES[name]


@dataclass(frozen=True)
class DeclaredQuantization:
    """The numerics a target's own config declares (its quantization_config): the engine serves the checkpoint in
    them, so emulating a scheme on top would measure a target nobody serves."""
    method: str | None  # quant_method, as written (None: not a string)
    bits: int | None  # the weights' bits where the config gives them

    @property
    def label(self) -> str:
        method = f"quant_method {quoted(self.method)}" if self.method is not None else "no quant_method"
        return method + (f", {self.bits} bits" if self.bits is not None else "")


def declared_quantization(config: Mapping[str, Any]) -> DeclaredQuantization | None:
    """The quantization_config a target config (or its text_config) declares; None where it declares none. Bits are
    read from `bits` (GPTQ, AWQ) or, for compressed-tensors, from its groups' weights when they agree."""
    text = config.get("text_config")
    found = config.get("quantization_config")
    if found is None and isinstance(text, Mapping):
        found = text.get("quantization_config")
    if found is None:
        return None
    if not isinstance(found, Mapping):
        return DeclaredQuantization(None, None)
    method = found.get("quant_method")
    return DeclaredQuantization(method if isinstance(method, str) else None, _declared_bits(found))


def _declared_bits(found: Mapping[str, Any]) -> int | None:
    def whole(value: Any) -> int | None:
        return value if isinstance(value, int) and not isinstance(value, bool) else None

    if whole(found.get("bits")) is not None:
        return whole(found.get("bits"))
    groups = found.get("config_groups")
    weights = [g.get("weights") for g in groups.values() if isinstance(g, Mapping)] \
        if isinstance(groups, Mapping) else []
    bits = {whole(w.get("num_bits")) for w in weights if isinstance(w, Mapping)}
    return bits.pop() if len(bits) == 1 else None


class DeclaresNumerics(Protocol):
    """A target's facts as the refusal reads them (eaglekit.target.TargetInfo)."""
    @property
    def path(self) -> str: ...

    @property
    def quantization(self) -> DeclaredQuantization | None: ...


def refuse_emulation_on_declared(asked: str | None, target: DeclaresNumerics) -> None:
    """Refuse `--target-quantization` on a target whose config already declares its numerics: the rounding would
    be applied on top of (or, loaded dequantised, instead of) what the engine serves, and the figures would describe
    no served model."""
    declared = target.quantization
    if asked is None or declared is None:
        return
    raise UsageError(f"--target-quantization {asked}: this target already declares its numerics (quantization_config:"
                     f" {declared.label}); a quantized checkpoint is measured as it is, so drop "
                     "--target-quantization, or give the full-precision model", target.path)


def round_e4m3(x):
    """Nearest E4M3 (FN) value, ties to even, saturating at ±448 (torch's cast rounds; clamping saturates)."""
    import torch

    return x.clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn).to(x.dtype)


def round_e2m1(x):
    """Nearest E2M1 value, ties to even, saturating at ±6."""
    import torch

    magnitude = x.abs()
    index = torch.zeros_like(magnitude, dtype=torch.long)
    for (low, high), up in zip(zip(E2M1_VALUES, E2M1_VALUES[1:]), E2M1_TIES_UP):
        middle = (low + high) / 2
        index += (magnitude >= middle) if up else (magnitude > middle)
    values = torch.tensor(E2M1_VALUES, dtype=x.dtype, device=x.device)
    return torch.sign(x) * values[index]


def _safe(scale):
    """A zero scale (an all-zero row or block) divides as 1: its values are zero and stay zero."""
    return scale.masked_fill(scale == 0, 1.0)


def fp8_rows(x):
    """x rounded to E4M3 with one scale per row (last dimension): amax / 448."""
    scale = _safe(x.abs().amax(dim=-1, keepdim=True) / E4M3_MAX)
    return round_e4m3(x / scale) * scale


def nvfp4_rows(x):
    """x rounded to NVFP4 along its last dimension: blocks of 16 with E4M3 scales under an FP32 scale per row
    (the second-level scale; for a weight, rows share the tensor's, see nvfp4_weight)."""
    return _nvfp4(x, x.abs().amax(dim=-1, keepdim=True))


def nvfp4_weight(w):
    """A weight rounded to NVFP4: blocks of 16 along the input dimension, one FP32 scale for the whole tensor."""
    return _nvfp4(w, w.abs().amax())


def _nvfp4(x, amax):
    import torch.nn.functional as F

    columns = x.shape[-1]
    pad = -columns % NVFP4_BLOCK
    padded = F.pad(x, (0, pad)) if pad else x
    blocks = padded.reshape(*padded.shape[:-1], -1, NVFP4_BLOCK)
    global_scale = _safe(amax / (E2M1_MAX * E4M3_MAX))
    if global_scale.dim() == x.dim():  # per row: (..., 1) -> (..., 1, 1) against (..., blocks, 16)
        global_scale = global_scale.unsqueeze(-1)
    block_scale = round_e4m3(blocks.abs().amax(dim=-1, keepdim=True) / E2M1_MAX / global_scale) * global_scale
    rounded = round_e2m1(blocks / _safe(block_scale)) * block_scale
    return rounded.reshape(padded.shape)[..., :columns]


def int_rows(w, bits: int, group: int | None = None, stored=None):
    """w rounded to signed `bits`-bit integers, symmetric, one scale per row or per `group` inputs of a row; with
    `stored` (a torch dtype) the scale is kept in it and each dequantised value is rounded to it, as a weight-only
    checkpoint stores and its kernel dequantises."""
    import torch
    import torch.nn.functional as F

    def keep(t):
        return t if stored is None else t.to(stored).to(t.dtype)

    top = 2 ** (bits - 1) - 1
    columns = w.shape[-1]
    size = group or columns
    pad = -columns % size
    padded = F.pad(w, (0, pad)) if pad else w
    groups = padded.reshape(*padded.shape[:-1], -1, size)
    scale = _safe(keep(groups.abs().amax(dim=-1, keepdim=True) / top))
    rounded = keep(torch.round(groups / scale).clamp(-top - 1, top) * scale)
    return rounded.reshape(padded.shape)[..., :columns]


WEIGHTS = {"fp8": lambda w, stored: fp8_rows(w), "nvfp4": lambda w, stored: nvfp4_weight(w),
           "int8": lambda w, stored: int_rows(w, 8, None, stored),
           "int4": lambda w, stored: int_rows(w, 4, INT4_GROUP, stored)}
ACTIVATIONS = {"fp8": fp8_rows, "nvfp4": nvfp4_rows}


def quantize_linear_layers(layers, name: str, stored) -> int:
    """Round the weights of every nn.Linear under `layers` (a target's decoder layers) to scheme `name` in place
    and, for W+A schemes, round their inputs at every call; `stored` is the model's 16-bit dtype, which the
    weight-only formats keep their scales and dequantised weights in. Returns the number of layers changed."""
    import torch

    weights, activations = WEIGHTS[name], ACTIVATIONS.get(name)
    changed = 0
    for module in (m for layer in layers for m in layer.modules() if isinstance(m, torch.nn.Linear)):
        with torch.no_grad():
            module.weight.copy_(weights(module.weight.float(), stored).to(module.weight.dtype))
        if activations is not None:
            module.register_forward_pre_hook(_input_rounder(activations))
        changed += 1
    return changed


def _input_rounder(rounding):
    """A forward pre-hook that rounds a linear layer's input (in float32, back to its dtype)."""
    def round_input(module, args):
        x = args[0]
        return (rounding(x.float()).to(x.dtype), *args[1:])

    return round_input
