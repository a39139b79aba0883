"""Triton kernels for the drafter's memory-bound elementwise steps, one launch per operation.

Every kernel loads in the storage dtype, computes in fp32 and rounds exactly where `torch_ops` rounds,
so half-precision results match the torch path bit for bit except where the fp32 reduction order
(or the GPU's rsqrt and fused multiply-adds) moves a value across a rounding boundary: rarely, and by
1 ulp per rounding, so at most 2 ulp for the norms, which round before and after the weight multiply.

Under TRITON_INTERPRET=1 (how the tests run these kernels on CPU) fp32 -> bf16 casts truncate
instead of rounding to nearest even, so there the kernels round bf16 with integer arithmetic;
compiled kernels keep the hardware conversion. The interpreter choice is made by `@triton.jit` when
this module is imported, so TRITON_INTERPRET must be set before that.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.language.extra import libdevice

from eaglekit.drafter.kernels.shapes import check_rope_shapes, check_same_shape, chunk_layout, half_width
from eaglekit.errors import UsageError

INTERPRETED = bool(triton.knobs.runtime.interpret)
"""Whether the kernels below were built for the CPU interpreter (read when the decorators ran)."""

MAX_BLOCK = 8192
"""Widest row tile; wider rows are normalised in two passes over BLOCK-wide tiles."""

SILU_BLOCK = 1024
ROPE_TILE_ELEMENTS = 4096
"""Upper bound on heads x padded head_dim handled by one RoPE program."""


@triton.jit
def _round(value, out_dtype: tl.constexpr, EMULATE_BF16_RTNE: tl.constexpr):
    """fp32 -> out_dtype, round to nearest even (integer emulation for bf16 under the interpreter)."""
    if EMULATE_BF16_RTNE:
        bits = value.to(tl.uint32, bitcast=True)
        bits = bits + 0x7FFF + ((bits >> 16) & 1)
        rounded = (bits >> 16).to(tl.uint16).to(tl.bfloat16, bitcast=True)
        is_nan = value != value  # noqa: PLR0124 - NaN is the only value unequal to itself
        return tl.where(is_nan, value.to(tl.bfloat16), rounded)
    else:
        return value.to(out_dtype)


@triton.jit
def _normalise_tile(values, rstd, weight_ptr, cols, mask, out_ptr, EMULATE_BF16_RTNE: tl.constexpr):
    """Store round(round(values * rstd) * weight): the weight multiply happens in the storage dtype."""
    out_dtype: tl.constexpr = out_ptr.dtype.element_ty
    weight = tl.load(weight_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    normed = _round(values * rstd, out_dtype, EMULATE_BF16_RTNE).to(tl.float32)
    tl.store(out_ptr + cols, _round(normed * weight, out_dtype, EMULATE_BF16_RTNE), mask=mask)


@triton.jit
def _inverse_rms(sum_of_squares, width, eps):
    # width * 1.0 rather than .to(): Triton passes an int argument equal to 1 as a constexpr.
    return tl.rsqrt(tl.math.div_rn(sum_of_squares, width * 1.0) + eps)


@triton.jit
def _rms_norm_row(in_ptr, weight_ptr, out_ptr, width, eps,
                  BLOCK: tl.constexpr, SINGLE_TILE: tl.constexpr, EMULATE_BF16_RTNE: tl.constexpr):
    """RMSNorm of one contiguous row; rows wider than BLOCK take two passes (squares, then scale)."""
    cols = tl.arange(0, BLOCK)
    if SINGLE_TILE:
        mask = cols < width
        values = tl.load(in_ptr + cols, mask=mask, other=0.0).to(tl.float32)
        rstd = _inverse_rms(tl.sum(values * values, axis=0), width, eps)
        _normalise_tile(values, rstd, weight_ptr, cols, mask, out_ptr, EMULATE_BF16_RTNE)
    else:
        squares = tl.zeros([BLOCK], dtype=tl.float32)
        for start in range(0, width, BLOCK):
            mask = start + cols < width
            values = tl.load(in_ptr + start + cols, mask=mask, other=0.0).to(tl.float32)
            squares += values * values
        rstd = _inverse_rms(tl.sum(squares, axis=0), width, eps)
        for start in range(0, width, BLOCK):
            mask = start + cols < width
            values = tl.load(in_ptr + start + cols, mask=mask, other=0.0).to(tl.float32)
            _normalise_tile(values, rstd, weight_ptr, start + cols, mask, out_ptr, EMULATE_BF16_RTNE)


@triton.jit
def _rms_norm_kernel(x_ptr, weight_ptr, out_ptr, width, x_row_stride, eps,
                     BLOCK: tl.constexpr, SINGLE_TILE: tl.constexpr, EMULATE_BF16_RTNE: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    _rms_norm_row(x_ptr + row * x_row_stride, weight_ptr, out_ptr + row * width, width, eps,
                  BLOCK, SINGLE_TILE, EMULATE_BF16_RTNE)


@triton.jit
def _multi_rms_norm_cat_kernel(x_ptr, weights_ptr, out_ptr, chunk_width, x_row_stride, out_row_stride, eps,
                               BLOCK: tl.constexpr, SINGLE_TILE: tl.constexpr, EMULATE_BF16_RTNE: tl.constexpr):
    """Grid (rows, K): program (n, k) normalises chunk k of row n into the same slice of the output."""
    row = tl.program_id(0).to(tl.int64)
    chunk_offset = tl.program_id(1).to(tl.int64) * chunk_width
    _rms_norm_row(x_ptr + row * x_row_stride + chunk_offset, weights_ptr + chunk_offset,
                  out_ptr + row * out_row_stride + chunk_offset, chunk_width, eps,
                  BLOCK, SINGLE_TILE, EMULATE_BF16_RTNE)


@triton.jit
def _dual_rms_norm_cat_kernel(a_ptr, b_ptr, weight_a_ptr, weight_b_ptr, out_ptr, width,
                              a_row_stride, b_row_stride, eps,
                              BLOCK: tl.constexpr, SINGLE_TILE: tl.constexpr, EMULATE_BF16_RTNE: tl.constexpr):
    """Grid (rows, 2): side 0 writes rms_norm(a) to out[:, :H], side 1 writes rms_norm(b) to out[:, H:]."""
    row = tl.program_id(0).to(tl.int64)
    out_row_ptr = out_ptr + row * 2 * width
    if tl.program_id(1) == 0:
        _rms_norm_row(a_ptr + row * a_row_stride, weight_a_ptr, out_row_ptr, width, eps,
                      BLOCK, SINGLE_TILE, EMULATE_BF16_RTNE)
    else:
        _rms_norm_row(b_ptr + row * b_row_stride, weight_b_ptr, out_row_ptr + width, width, eps,
                      BLOCK, SINGLE_TILE, EMULATE_BF16_RTNE)


@triton.jit
def _rounded_sum(x_ptr, residual_ptr, cols, mask, out_dtype: tl.constexpr, EMULATE_BF16_RTNE: tl.constexpr):
    x = tl.load(x_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    residual = tl.load(residual_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    return _round(x + residual, out_dtype, EMULATE_BF16_RTNE)


@triton.jit
def _fused_add_rms_norm_kernel(x_ptr, residual_ptr, weight_ptr, out_ptr, sum_ptr, width,
                               x_row_stride, residual_row_stride, eps,
                               BLOCK: tl.constexpr, SINGLE_TILE: tl.constexpr, EMULATE_BF16_RTNE: tl.constexpr):
    """Store s = round(x + residual) and rms_norm(s); the norm sees the rounded sum, as HF does."""
    row = tl.program_id(0).to(tl.int64)
    x_ptr += row * x_row_stride
    residual_ptr += row * residual_row_stride
    out_ptr += row * width
    sum_ptr += row * width
    sum_dtype: tl.constexpr = sum_ptr.dtype.element_ty
    cols = tl.arange(0, BLOCK)
    if SINGLE_TILE:
        mask = cols < width
        summed = _rounded_sum(x_ptr, residual_ptr, cols, mask, sum_dtype, EMULATE_BF16_RTNE)
        tl.store(sum_ptr + cols, summed, mask=mask)
        values = summed.to(tl.float32)
        rstd = _inverse_rms(tl.sum(values * values, axis=0), width, eps)
        _normalise_tile(values, rstd, weight_ptr, cols, mask, out_ptr, EMULATE_BF16_RTNE)
    else:
        squares = tl.zeros([BLOCK], dtype=tl.float32)
        for start in range(0, width, BLOCK):
            mask = start + cols < width
            summed = _rounded_sum(x_ptr, residual_ptr, start + cols, mask, sum_dtype, EMULATE_BF16_RTNE)
            tl.store(sum_ptr + start + cols, summed, mask=mask)
            values = summed.to(tl.float32)
            squares += values * values
        rstd = _inverse_rms(tl.sum(squares, axis=0), width, eps)
        for start in range(0, width, BLOCK):
            mask = start + cols < width
            # Recomputed from the inputs rather than re-read from sum_ptr: another thread may have stored it.
            summed = _rounded_sum(x_ptr, residual_ptr, start + cols, mask, sum_dtype, EMULATE_BF16_RTNE)
            _normalise_tile(summed.to(tl.float32), rstd, weight_ptr, start + cols, mask, out_ptr,
                            EMULATE_BF16_RTNE)


@triton.jit
def _exp(x, LIBDEVICE_EXP: tl.constexpr):
    """The GPU's libdevice expf is the one torch's CUDA silu calls; the interpreter has no libdevice."""
    if LIBDEVICE_EXP:
        return libdevice.exp(x)
    else:
        return tl.exp(x)


@triton.jit
def _silu_and_mul_kernel(x_ptr, out_ptr, width, x_row_stride,
                         BLOCK: tl.constexpr, LIBDEVICE_EXP: tl.constexpr, EMULATE_BF16_RTNE: tl.constexpr):
    """Grid (rows, cdiv(I, BLOCK)): out = silu(gate) * up in fp32, rounded once."""
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < width
    gate = tl.load(x_ptr + row * x_row_stride + cols, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(x_ptr + row * x_row_stride + width + cols, mask=mask, other=0.0).to(tl.float32)
    silu = tl.math.div_rn(gate, 1.0 + _exp(-gate, LIBDEVICE_EXP))
    out_dtype: tl.constexpr = out_ptr.dtype.element_ty
    tl.store(out_ptr + row * width + cols, _round(silu * up, out_dtype, EMULATE_BF16_RTNE), mask=mask)


@triton.jit
def _rope_heads(in_ptr, out_ptr, cos_ptr, sin_ptr, first_head, num_heads, head_stride, head_dim, rot,
                HEADS: tl.constexpr, DIMS: tl.constexpr, EMULATE_BF16_RTNE: tl.constexpr):
    """Rotate HEADS heads of one token: out = x * cos + rotate_half(x) * sin on dims < rot, copy the rest."""
    heads = first_head + tl.arange(0, HEADS)[:, None]
    dims = tl.arange(0, DIMS)[None, :]
    half = rot // 2
    in_first_half = dims < half
    in_rotary = dims < rot
    partner = tl.where(in_first_half, dims + half, tl.where(in_rotary, dims - half, dims))
    mask = (heads < num_heads) & (dims < head_dim)
    values = tl.load(in_ptr + heads * head_stride + dims, mask=mask, other=0.0).to(tl.float32)
    partners = tl.load(in_ptr + heads * head_stride + partner, mask=mask, other=0.0).to(tl.float32)
    cos = tl.load(cos_ptr + dims, mask=in_rotary, other=0.0).to(tl.float32)
    sin = tl.load(sin_ptr + dims, mask=in_rotary, other=0.0).to(tl.float32)
    rotated_half = tl.where(in_first_half, -partners, partners)
    result = tl.where(in_rotary, values * cos + rotated_half * sin, values)
    out_dtype: tl.constexpr = out_ptr.dtype.element_ty
    tl.store(out_ptr + heads * head_dim + dims, _round(result, out_dtype, EMULATE_BF16_RTNE), mask=mask)


@triton.jit
def _rope_kernel(q_ptr, k_ptr, cos_ptr, sin_ptr, q_out_ptr, k_out_ptr,
                 q_heads, k_heads, head_dim, rot,
                 q_token_stride, q_head_stride, k_token_stride, k_head_stride, cos_token_stride, sin_token_stride,
                 HEADS: tl.constexpr, DIMS: tl.constexpr,
                 EMULATE_BF16_RTNE_Q: tl.constexpr, EMULATE_BF16_RTNE_K: tl.constexpr):
    """Grid (tokens, q head blocks + k head blocks): q and k of every token in one launch."""
    token = tl.program_id(0).to(tl.int64)
    head_block = tl.program_id(1)
    q_blocks = tl.cdiv(q_heads, HEADS)
    cos_ptr += token * cos_token_stride
    sin_ptr += token * sin_token_stride
    if head_block < q_blocks:
        _rope_heads(q_ptr + token * q_token_stride, q_out_ptr + token * q_heads * head_dim, cos_ptr, sin_ptr,
                    head_block * HEADS, q_heads, q_head_stride, head_dim, rot, HEADS, DIMS, EMULATE_BF16_RTNE_Q)
    else:
        _rope_heads(k_ptr + token * k_token_stride, k_out_ptr + token * k_heads * head_dim, cos_ptr, sin_ptr,
                    (head_block - q_blocks) * HEADS, k_heads, k_head_stride, head_dim, rot, HEADS, DIMS,
                    EMULATE_BF16_RTNE_K)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, *, max_block: int = MAX_BLOCK) -> torch.Tensor:
    """RMSNorm over the last dimension of x [..., D]; one program per row."""
    width = x.shape[-1]
    weight = _weight_for(weight, x, (width,), "weight")
    rows = _rows(x, width)
    out = torch.empty(rows.shape, dtype=x.dtype, device=x.device)
    if rows.shape[0]:
        block, single_tile = _row_tiling(width, max_block)
        _rms_norm_kernel[(rows.shape[0],)](
            rows, weight, out, width, rows.stride(0), eps,
            BLOCK=block, SINGLE_TILE=single_tile, EMULATE_BF16_RTNE=_emulate_bf16(x), num_warps=_num_warps(block),
        )
    return out.view(x.shape)


def fused_add_rms_norm(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float, *, max_block: int = MAX_BLOCK
) -> tuple[torch.Tensor, torch.Tensor]:
    """(rms_norm(s), s) with s = x + residual in fp32 rounded to x's dtype; new tensors, inputs untouched."""
    check_same_shape(x, residual, "x and residual")
    width = x.shape[-1]
    weight = _weight_for(weight, x, (width,), "weight")
    x_rows, residual_rows = _rows(x, width), _rows(residual, width)
    out = torch.empty(x_rows.shape, dtype=x.dtype, device=x.device)
    summed = torch.empty_like(out)
    if x_rows.shape[0]:
        block, single_tile = _row_tiling(width, max_block)
        _fused_add_rms_norm_kernel[(x_rows.shape[0],)](
            x_rows, residual_rows, weight, out, summed, width, x_rows.stride(0), residual_rows.stride(0), eps,
            BLOCK=block, SINGLE_TILE=single_tile, EMULATE_BF16_RTNE=_emulate_bf16(x), num_warps=_num_warps(block),
        )
    return out.view(x.shape), summed.view(x.shape)


def multi_rms_norm_cat(
    x: torch.Tensor, weights: torch.Tensor, eps: float, *, max_block: int = MAX_BLOCK
) -> torch.Tensor:
    """EAGLE-3.1 fc_norm: chunk k of x [..., K*T] normalised with weights[k], in one (rows, K) launch."""
    num_chunks, chunk_width = chunk_layout(x, weights)
    weights = _weight_for(weights, x, (num_chunks, chunk_width), "weights")
    rows = _rows(x, num_chunks * chunk_width)
    out = torch.empty(rows.shape, dtype=x.dtype, device=x.device)
    if rows.shape[0]:
        block, single_tile = _row_tiling(chunk_width, max_block)
        _multi_rms_norm_cat_kernel[(rows.shape[0], num_chunks)](
            rows, weights, out, chunk_width, rows.stride(0), out.stride(0), eps,
            BLOCK=block, SINGLE_TILE=single_tile, EMULATE_BF16_RTNE=_emulate_bf16(x), num_warps=_num_warps(block),
        )
    return out.view(x.shape)


def dual_rms_norm_cat(
    a: torch.Tensor, b: torch.Tensor, weight_a: torch.Tensor, weight_b: torch.Tensor, eps: float,
    *, max_block: int = MAX_BLOCK,
) -> torch.Tensor:
    """cat([rms_norm(a, weight_a), rms_norm(b, weight_b)], -1) for a, b [..., H], in one (rows, 2) launch."""
    check_same_shape(a, b, "a and b")
    if a.dtype != b.dtype:
        raise ValueError(f"a and b must have the same dtype, got {a.dtype} and {b.dtype}")
    width = a.shape[-1]
    weight_a = _weight_for(weight_a, a, (width,), "weight_a")
    weight_b = _weight_for(weight_b, a, (width,), "weight_b")
    a_rows, b_rows = _rows(a, width), _rows(b, width)
    out = torch.empty((a_rows.shape[0], 2 * width), dtype=a.dtype, device=a.device)
    if a_rows.shape[0]:
        block, single_tile = _row_tiling(width, max_block)
        _dual_rms_norm_cat_kernel[(a_rows.shape[0], 2)](
            a_rows, b_rows, weight_a, weight_b, out, width, a_rows.stride(0), b_rows.stride(0), eps,
            BLOCK=block, SINGLE_TILE=single_tile, EMULATE_BF16_RTNE=_emulate_bf16(a), num_warps=_num_warps(block),
        )
    return out.view(*a.shape[:-1], 2 * width)


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    """silu(x[..., :I]) * x[..., I:] for x [..., 2I], in fp32, rounded once."""
    width = half_width(x)
    rows = _rows(x, 2 * width)
    out = torch.empty((rows.shape[0], width), dtype=x.dtype, device=x.device)
    if rows.shape[0] and width:
        block = min(SILU_BLOCK, triton.next_power_of_2(width))
        _silu_and_mul_kernel[(rows.shape[0], triton.cdiv(width, block))](
            rows, out, width, rows.stride(0),
            BLOCK=block, LIBDEVICE_EXP=not INTERPRETED, EMULATE_BF16_RTNE=_emulate_bf16(x),
            num_warps=_num_warps(block),
        )
    return out.view(*x.shape[:-1], width)


def apply_rope(
    q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """NeoX rotary embedding on the first rot = cos.shape[-1] dims of every q and k head, in one launch."""
    rot = check_rope_shapes(q, k, cos, sin)
    _check_device(q)
    tokens, q_heads, head_dim = q.shape
    k_heads = k.shape[1]
    q, k, cos, sin = (_unit_last_stride(t) for t in (q, k, cos, sin))
    q_out = torch.empty((tokens, q_heads, head_dim), dtype=q.dtype, device=q.device)
    k_out = torch.empty((tokens, k_heads, head_dim), dtype=k.dtype, device=k.device)
    if tokens:
        dims = triton.next_power_of_2(head_dim)
        heads = min(triton.next_power_of_2(max(q_heads, k_heads, 1)), max(1, ROPE_TILE_ELEMENTS // dims))
        head_blocks = triton.cdiv(q_heads, heads) + triton.cdiv(k_heads, heads)
        _rope_kernel[(tokens, head_blocks)](
            q, k, cos, sin, q_out, k_out, q_heads, k_heads, head_dim, rot,
            q.stride(0), q.stride(1), k.stride(0), k.stride(1), cos.stride(0), sin.stride(0),
            HEADS=heads, DIMS=dims, EMULATE_BF16_RTNE_Q=_emulate_bf16(q), EMULATE_BF16_RTNE_K=_emulate_bf16(k),
            num_warps=_num_warps(heads * dims),
        )
    return q_out, k_out


def _emulate_bf16(x: torch.Tensor) -> bool:
    return INTERPRETED and x.dtype == torch.bfloat16


def _row_tiling(width: int, max_block: int) -> tuple[int, bool]:
    """(BLOCK, SINGLE_TILE): the whole row in registers when it fits, else max_block-wide tiles."""
    block = triton.next_power_of_2(max(width, 1))
    return (block, True) if block <= max_block else (triton.next_power_of_2(max_block), False)


def _num_warps(block_elements: int) -> int:
    return max(1, min(16, block_elements // 256))


def _check_device(x: torch.Tensor) -> None:
    if x.device.type != "cuda" and not INTERPRETED:
        raise UsageError(
            f"the Triton kernels need CUDA tensors (got {x.device.type}); on CPU use EAGLEKIT_KERNELS=torch, "
            "or set TRITON_INTERPRET=1 before eaglekit.drafter.kernels.triton_ops is imported"
        )


def _unit_last_stride(x: torch.Tensor) -> torch.Tensor:
    return x if x.stride(-1) == 1 else x.contiguous()


def _rows(x: torch.Tensor, width: int) -> torch.Tensor:
    """x as [rows, width] with unit column stride; rows may be strided (a view of a wider buffer)."""
    _check_device(x)
    if x.shape[-1] != width:
        raise ValueError(f"last dimension {x.shape[-1]} does not match {width}")
    rows = x.reshape(-1, width)
    return rows if rows.stride(-1) == 1 or width <= 1 else rows.contiguous()


def _weight_for(weight: torch.Tensor, x: torch.Tensor, shape: tuple[int, ...], name: str) -> torch.Tensor:
    """The weight in x's dtype and contiguous: the torch path multiplies by weight.to(x.dtype) too."""
    if tuple(weight.shape) != shape:
        raise ValueError(f"{name} must have shape {shape}, got {tuple(weight.shape)}")
    if weight.device != x.device:
        raise ValueError(f"{name} is on {weight.device} but the input is on {x.device}")
    return weight.to(x.dtype).contiguous()
