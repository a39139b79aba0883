"""Fused kernels against the torch path, and the torch path against HF and naive formulas.

On a CPU machine the Triton kernels run under TRITON_INTERPRET=1 (set in conftest.py before any
kernel module is imported), so shapes stay small: the interpreter runs programs one after another.
"""

from __future__ import annotations

import math
import subprocess
import sys
import zlib

import numpy as np
import pytest
import torch

pytest.importorskip("triton")

from eaglekit.drafter import kernels  # noqa: E402
from eaglekit.drafter.kernels import torch_ops, triton_ops  # noqa: E402
from eaglekit.drafter.kernels.ulps import ulp_distance  # noqa: E402
from eaglekit.errors import UsageError  # noqa: E402

pytestmark = pytest.mark.triton

if not triton_ops.INTERPRETED and not torch.cuda.is_available():
    pytest.skip("Triton kernels need CUDA or TRITON_INTERPRET=1", allow_module_level=True)

DEVICE = "cpu" if triton_ops.INTERPRETED else "cuda"
HALF_DTYPES = (torch.float16, torch.bfloat16)
DTYPES = (torch.float32, *HALF_DTYPES)
EPS = 1e-6

FP32_RTOL, FP32_ATOL = 2e-6, 1e-6
"""Triton and torch sum the squares in different orders, and compiled kernels fuse multiply-adds, so
fp32 results move by a few ulp (RoPE's cancelling terms make that an absolute, not relative, error)."""

HALF_MAX_ULPS = 1
NORM_HALF_MAX_ULPS = 2
"""Those fp32 differences change a half-precision result only when the fp32 value sits within a few
fp32 ulp of a rounding midpoint, and then by 1 ulp. The norms round twice (before and after the
weight multiply), and the weight can scale a 1-ulp change of the first rounding to 2 ulp of the output."""

HALF_MAX_MISMATCH_FRACTION = 5e-3
"""The odds of such a midpoint are about 8 / 2**13 per fp16 value; more frequent means a real bug.
The interpreter shows none; compiled GPU kernels a few."""


@pytest.fixture
def gen(request) -> torch.Generator:
    """A generator seeded from the test id: every parametrised case draws different, reproducible inputs."""
    return torch.Generator().manual_seed(zlib.crc32(request.node.nodeid.encode()))


@pytest.fixture
def triton_backend(monkeypatch):
    monkeypatch.setenv(kernels.BACKEND_ENV, "triton")


def randn(gen: torch.Generator, *shape: int, dtype=torch.float32, scale: float = 1.0) -> torch.Tensor:
    return (torch.randn(*shape, generator=gen) * scale).to(dtype=dtype, device=DEVICE)


def assert_matches(actual: torch.Tensor, expected: torch.Tensor, half_max_ulps: int = HALF_MAX_ULPS) -> None:
    assert actual.dtype == expected.dtype and actual.shape == expected.shape
    if expected.dtype == torch.float32:
        torch.testing.assert_close(actual, expected, rtol=FP32_RTOL, atol=FP32_ATOL)
    else:
        distance = ulp_distance(actual, expected)
        assert distance.max().item() <= half_max_ulps
        assert (distance > 0).float().mean().item() <= HALF_MAX_MISMATCH_FRACTION


def test_ulp_distance_counts_representable_values():
    one_up = torch.nextafter(torch.tensor(1.0), torch.tensor(2.0)).item()
    actual = torch.tensor([0.0, 1.0, -1e-45, 1.0])
    expected = torch.tensor([-0.0, one_up, 1e-45, 1.0])
    assert ulp_distance(actual, expected).tolist() == [0, 1, 2, 0]
    bf16 = torch.tensor([1.0, -2.0], dtype=torch.bfloat16)
    assert ulp_distance(bf16, torch.tensor([1 + 2**-7, -2.0], dtype=torch.bfloat16)).tolist() == [1, 0]


# --- dispatch ---------------------------------------------------------------------------------


@pytest.mark.parametrize("forced", ["torch", "triton", "TRITON"])
def test_backend_follows_env(monkeypatch, forced):
    monkeypatch.setenv(kernels.BACKEND_ENV, forced)
    assert kernels.backend() == forced.lower()
    assert kernels.backend("cpu") == forced.lower()


def test_backend_default_is_triton_on_cuda_only(monkeypatch):
    monkeypatch.delenv(kernels.BACKEND_ENV, raising=False)
    assert kernels.backend("cpu") == "torch"
    assert kernels.backend(torch.device("cuda", 0)) == "triton"


def test_backend_rejects_unknown_value(monkeypatch):
    monkeypatch.setenv(kernels.BACKEND_ENV, "cuda")
    with pytest.raises(UsageError, match="EAGLEKIT_KERNELS"):
        kernels.backend()


def test_calls_dispatch_to_the_chosen_backend(monkeypatch, gen):
    calls = []
    monkeypatch.setattr(triton_ops, "silu_and_mul", lambda x: calls.append("triton") or torch_ops.silu_and_mul(x))
    x = randn(gen, 2, 8)
    monkeypatch.setenv(kernels.BACKEND_ENV, "torch")
    kernels.silu_and_mul(x)
    assert calls == []
    monkeypatch.setenv(kernels.BACKEND_ENV, "triton")
    kernels.silu_and_mul(x)
    assert calls == ["triton"]


def test_autograd_calls_take_the_torch_path(triton_backend, gen):
    x = randn(gen, 3, 16).requires_grad_()
    weight = randn(gen, 16).requires_grad_()
    kernels.rms_norm(x, weight, EPS).sum().backward()
    assert x.grad is not None and weight.grad is not None


def test_importing_the_package_does_not_import_triton():
    code = "import sys, eaglekit.drafter.kernels; print('triton' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "False"


# --- Triton kernels vs the torch path ----------------------------------------------------------

NORM_SHAPES = [((1, 1000), None), ((3, 4096), None), ((2, 3, 97), None), ((3, 130), 64), ((1, 1000), 256)]
"""(x shape, max_block): max_block forces the two-pass loop over tiles narrower than the row."""


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape,max_block", NORM_SHAPES)
def test_rms_norm(triton_backend, gen, dtype, shape, max_block):
    x = randn(gen, *shape, dtype=dtype)
    weight = randn(gen, shape[-1], dtype=dtype, scale=0.5) + 1
    expected = torch_ops.rms_norm(x, weight, EPS)
    actual = kernels.rms_norm(x, weight, EPS) if max_block is None else triton_ops.rms_norm(
        x, weight, EPS, max_block=max_block)
    assert_matches(actual, expected, NORM_HALF_MAX_ULPS)


def test_rms_norm_strided_rows_and_fp32_weight(triton_backend, gen):
    buffer = randn(gen, 3, 300, dtype=torch.bfloat16)
    x = buffer[:, 50:247]
    weight = randn(gen, 197)
    assert_matches(kernels.rms_norm(x, weight, EPS), torch_ops.rms_norm(x, weight, EPS), NORM_HALF_MAX_ULPS)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape,max_block", NORM_SHAPES)
def test_fused_add_rms_norm(triton_backend, gen, dtype, shape, max_block):
    x = randn(gen, *shape, dtype=dtype)
    residual = randn(gen, *shape, dtype=dtype, scale=4.0)
    weight = randn(gen, shape[-1], dtype=dtype, scale=0.5) + 1
    x_before, residual_before = x.clone(), residual.clone()
    expected_normed, expected_sum = torch_ops.fused_add_rms_norm(x, residual, weight, EPS)
    if max_block is None:
        normed, summed = kernels.fused_add_rms_norm(x, residual, weight, EPS)
    else:
        normed, summed = triton_ops.fused_add_rms_norm(x, residual, weight, EPS, max_block=max_block)
    assert torch.equal(summed, expected_sum)
    assert_matches(normed, expected_normed, NORM_HALF_MAX_ULPS)
    assert torch.equal(x, x_before) and torch.equal(residual, residual_before)


def test_fused_add_rms_norm_fp32_residual(triton_backend, gen):
    x = randn(gen, 2, 130, dtype=torch.bfloat16)
    residual = randn(gen, 2, 130)
    weight = randn(gen, 130, dtype=torch.bfloat16)
    normed, summed = kernels.fused_add_rms_norm(x, residual, weight, EPS)
    expected_normed, expected_sum = torch_ops.fused_add_rms_norm(x, residual, weight, EPS)
    assert summed.dtype == torch.bfloat16 and torch.equal(summed, expected_sum)
    assert_matches(normed, expected_normed, NORM_HALF_MAX_ULPS)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("rows,num_chunks,chunk_width,max_block",
                         [(1, 3, 97, None), (3, 2, 256, None), (3, 4, 97, None), (1, 3, 130, 32)])
def test_multi_rms_norm_cat(triton_backend, gen, dtype, rows, num_chunks, chunk_width, max_block):
    x = randn(gen, rows, num_chunks * chunk_width, dtype=dtype, scale=3.0)
    weights = randn(gen, num_chunks, chunk_width, dtype=dtype, scale=0.5) + 1
    expected = torch_ops.multi_rms_norm_cat(x, weights, EPS)
    actual = kernels.multi_rms_norm_cat(x, weights, EPS) if max_block is None else triton_ops.multi_rms_norm_cat(
        x, weights, EPS, max_block=max_block)
    assert_matches(actual, expected, NORM_HALF_MAX_ULPS)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("rows,width,max_block", [(1, 130, None), (3, 130, None), (3, 512, None), (3, 130, 64)])
def test_dual_rms_norm_cat(triton_backend, gen, dtype, rows, width, max_block):
    a = randn(gen, rows, width, dtype=dtype)
    b = randn(gen, rows, width, dtype=dtype, scale=10.0)
    weight_a = randn(gen, width, dtype=dtype, scale=0.5) + 1
    weight_b = randn(gen, width, dtype=dtype, scale=0.5) + 1
    expected = torch_ops.dual_rms_norm_cat(a, b, weight_a, weight_b, EPS)
    if max_block is None:
        actual = kernels.dual_rms_norm_cat(a, b, weight_a, weight_b, EPS)
    else:
        actual = triton_ops.dual_rms_norm_cat(a, b, weight_a, weight_b, EPS, max_block=max_block)
    assert actual.shape == (rows, 2 * width)
    assert_matches(actual, expected, NORM_HALF_MAX_ULPS)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", [(1, 2 * 1000), (3, 2 * 97), (3, 2 * 1500), (2, 2, 2 * 64)])
def test_silu_and_mul(triton_backend, gen, dtype, shape):
    x = randn(gen, *shape, dtype=dtype, scale=4.0)
    actual = kernels.silu_and_mul(x)
    assert actual.shape == (*shape[:-1], shape[-1] // 2)
    assert_matches(actual, torch_ops.silu_and_mul(x))


@pytest.mark.filterwarnings("ignore:overflow encountered in exp:RuntimeWarning")
def test_silu_and_mul_extremes(triton_backend):
    gate = torch.tensor([-100.0, -30.0, -0.0, 0.0, 30.0, 100.0, 1e-30, -1e-30], device=DEVICE)
    x = torch.cat([gate, torch.full_like(gate, 3.0)]).unsqueeze(0)
    actual, expected = kernels.silu_and_mul(x), torch_ops.silu_and_mul(x)
    assert torch.isfinite(actual).all()
    assert_matches(actual, expected)


ROPE_CASES = [
    # tokens, q heads, kv heads, head_dim, rot
    (3, 4, 2, 24, 16),
    (1, 32, 8, 128, 128),
    (3, 3, 1, 64, 64),
    (1, 40, 8, 128, 64),
    (2, 5, 5, 20, 6),
]


def cos_sin(gen: torch.Generator, tokens: int, rot: int, dtype=torch.float32) -> tuple[torch.Tensor, torch.Tensor]:
    """HF-style tables: angles for random positions, duplicated over the two halves."""
    positions = torch.randint(0, 4096, (tokens,), generator=gen).double()
    inv_freq = 1.0 / (10000.0 ** (torch.arange(0, rot, 2, dtype=torch.float64) / rot))
    angles = torch.outer(positions, inv_freq)
    angles = torch.cat([angles, angles], dim=-1)
    return angles.cos().to(dtype=dtype, device=DEVICE), angles.sin().to(dtype=dtype, device=DEVICE)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("tokens,q_heads,kv_heads,head_dim,rot", ROPE_CASES)
def test_apply_rope(triton_backend, gen, dtype, tokens, q_heads, kv_heads, head_dim, rot):
    q = randn(gen, tokens, q_heads, head_dim, dtype=dtype)
    k = randn(gen, tokens, kv_heads, head_dim, dtype=dtype)
    cos, sin = cos_sin(gen, tokens, rot, dtype=dtype)
    q_out, k_out = kernels.apply_rope(q, k, cos, sin)
    expected_q, expected_k = torch_ops.apply_rope(q, k, cos, sin)
    assert_matches(q_out, expected_q)
    assert_matches(k_out, expected_k)
    assert torch.equal(q_out[..., rot:], q[..., rot:]) and torch.equal(k_out[..., rot:], k[..., rot:])


def test_apply_rope_on_views_of_a_packed_qkv(triton_backend, gen):
    tokens, q_heads, kv_heads, head_dim = 3, 4, 2, 32
    qkv = randn(gen, tokens, (q_heads + 2 * kv_heads) * head_dim, dtype=torch.bfloat16)
    q = qkv[:, : q_heads * head_dim].view(tokens, q_heads, head_dim)
    k = qkv[:, q_heads * head_dim: (q_heads + kv_heads) * head_dim].view(tokens, kv_heads, head_dim)
    cos, sin = cos_sin(gen, tokens, head_dim)
    for actual, expected in zip(kernels.apply_rope(q, k, cos, sin), torch_ops.apply_rope(q, k, cos, sin)):
        assert actual.is_contiguous()
        assert_matches(actual, expected)


def test_bf16_rounding_is_to_nearest_even(triton_backend):
    """Sums that land exactly on, or just past, the midpoint between two bf16 neighbours (ulp 2**-7 at 1)."""
    x = torch.tensor([1.0, 1 + 2**-7, 1.0, -1.0, -(1 + 2**-7)], dtype=torch.bfloat16, device=DEVICE)
    residual = torch.tensor([2**-8, 2**-8, 2**-8 + 2**-20, -(2**-8), -(2**-8)], device=DEVICE)
    _, summed = kernels.fused_add_rms_norm(x, residual, torch.ones(5, device=DEVICE), EPS)
    expected = torch.tensor([1.0, 1 + 2**-6, 1 + 2**-7, -1.0, -(1 + 2**-6)], dtype=torch.bfloat16)
    assert torch.equal(summed.cpu(), expected)


@pytest.mark.parametrize("path", [torch_ops, triton_ops], ids=["torch", "triton"])
def test_shape_errors(path):
    x = torch.zeros(2, 12, device=DEVICE)
    with pytest.raises(ValueError, match="K\\*T"):
        path.multi_rms_norm_cat(x, torch.ones(5, 2, device=DEVICE), EPS)
    with pytest.raises(ValueError, match="even"):
        path.silu_and_mul(torch.zeros(2, 7, device=DEVICE))
    with pytest.raises(ValueError, match="rotary width"):
        cos = torch.ones(2, 3, device=DEVICE)
        path.apply_rope(torch.zeros(2, 4, 8, device=DEVICE), torch.zeros(2, 2, 8, device=DEVICE), cos, cos)
    with pytest.raises(ValueError, match="same shape"):
        path.dual_rms_norm_cat(x, x[:1], torch.ones(12, device=DEVICE), torch.ones(12, device=DEVICE), EPS)


# --- the torch path vs independent formulas ----------------------------------------------------


def naive_rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Row by row in float64 with numpy; the one rounding HF does before the weight multiply is kept."""
    values = x.double().cpu().numpy()
    normed = np.empty_like(values)
    for index in np.ndindex(values.shape[:-1]):
        row = values[index]
        normed[index] = row / math.sqrt(float(np.mean(row * row)) + eps)
    rounded = torch.from_numpy(normed).to(x.dtype).double()
    return (rounded * weight.double().cpu().to(x.dtype).double()).to(x.dtype)


def assert_close_to_naive(actual: torch.Tensor, naive: torch.Tensor) -> None:
    """fp32 to fp32 accuracy (absolute too: RoPE cancels); half precision within 1 ulp of the float64 result."""
    if actual.dtype == torch.float32:
        torch.testing.assert_close(actual.cpu().double(), naive.double(), rtol=1e-6, atol=1e-6)
    else:
        assert ulp_distance(actual, naive).max().item() <= 1


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_torch_rms_norm_matches_naive_formula(gen, dtype):
    x = randn(gen, 3, 257, dtype=dtype, scale=5.0)
    weight = randn(gen, 257, dtype=dtype) + 1
    assert_close_to_naive(torch_ops.rms_norm(x, weight, EPS), naive_rms_norm(x, weight, EPS))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_torch_rms_norm_is_hf_llama_rms_norm(gen, dtype):
    llama = pytest.importorskip("transformers.models.llama.modeling_llama")
    module = llama.LlamaRMSNorm(130, eps=EPS).to(dtype=dtype, device=DEVICE)
    with torch.no_grad():
        module.weight.copy_(randn(gen, 130, dtype=dtype) + 1)
    x = randn(gen, 4, 130, dtype=dtype, scale=2.0)
    with torch.no_grad():
        assert torch.equal(torch_ops.rms_norm(x, module.weight, EPS), module(x))


def test_torch_rms_norm_rounds_before_the_weight_multiply(gen):
    x = randn(gen, 4, 512, dtype=torch.bfloat16)
    weight = randn(gen, 512, dtype=torch.bfloat16) * 3
    rstd = torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + EPS)
    one_rounding = (x.float() * rstd * weight.float()).to(torch.bfloat16)
    assert not torch.equal(torch_ops.rms_norm(x, weight, EPS), one_rounding)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_torch_fused_add_rms_norm_is_add_then_norm(gen, dtype):
    x = randn(gen, 3, 130, dtype=dtype)
    residual = randn(gen, 3, 130, dtype=dtype, scale=8.0)
    weight = randn(gen, 130, dtype=dtype) + 1
    normed, summed = torch_ops.fused_add_rms_norm(x, residual, weight, EPS)
    assert torch.equal(summed, x + residual)
    assert_close_to_naive(normed, naive_rms_norm(x + residual, weight, EPS))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("num_chunks", [2, 3, 4])
def test_torch_multi_and_dual_norm_are_norms_then_cat(gen, dtype, num_chunks):
    width = 97
    x = randn(gen, 3, num_chunks * width, dtype=dtype, scale=4.0)
    weights = randn(gen, num_chunks, width, dtype=dtype) + 1
    per_chunk = [naive_rms_norm(chunk, weights[k], EPS) for k, chunk in enumerate(x.split(width, dim=-1))]
    assert_close_to_naive(torch_ops.multi_rms_norm_cat(x, weights, EPS), torch.cat(per_chunk, dim=-1))
    a, b = x[:, :width], x[:, width: 2 * width]
    expected = torch.cat([naive_rms_norm(a, weights[0], EPS), naive_rms_norm(b, weights[1], EPS)], dim=-1)
    assert_close_to_naive(torch_ops.dual_rms_norm_cat(a, b, weights[0], weights[1], EPS), expected)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_torch_silu_and_mul_matches_naive_formula(gen, dtype):
    x = randn(gen, 3, 2 * 193, dtype=dtype, scale=6.0)
    values = x.double().cpu().numpy()
    gate, up = values[:, :193], values[:, 193:]
    naive = torch.from_numpy(gate / (1.0 + np.exp(-gate)) * up).to(dtype)
    assert_close_to_naive(torch_ops.silu_and_mul(x), naive)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("head_dim,rot", [(16, 16), (24, 8)])
def test_torch_rope_matches_per_pair_rotation(gen, dtype, head_dim, rot):
    tokens, heads = 3, 2
    q = randn(gen, tokens, heads, head_dim, dtype=dtype)
    cos, sin = cos_sin(gen, tokens, rot)
    rotated, _ = torch_ops.apply_rope(q, q[:, :1], cos, sin)
    values, c, s = q.double().cpu().numpy(), cos.double().cpu().numpy(), sin.double().cpu().numpy()
    naive = values.copy()
    half = rot // 2
    for token, head, i in np.ndindex(tokens, heads, half):
        x1, x2 = values[token, head, i], values[token, head, i + half]
        naive[token, head, i] = x1 * c[token, i] - x2 * s[token, i]
        naive[token, head, i + half] = x2 * c[token, i + half] + x1 * s[token, i + half]
    assert_close_to_naive(rotated, torch.from_numpy(naive).to(dtype))


def test_torch_rope_is_hf_apply_rotary_pos_emb_in_fp32(gen):
    llama = pytest.importorskip("transformers.models.llama.modeling_llama")
    tokens, q_heads, kv_heads, head_dim = 5, 4, 2, 32
    q = randn(gen, tokens, q_heads, head_dim)
    k = randn(gen, tokens, kv_heads, head_dim)
    cos, sin = cos_sin(gen, tokens, head_dim)
    # HF layout: [batch, heads, seq, hd] with cos/sin [batch, seq, hd].
    hf_q, hf_k = llama.apply_rotary_pos_emb(q.transpose(0, 1)[None], k.transpose(0, 1)[None], cos[None], sin[None])
    q_out, k_out = torch_ops.apply_rope(q, k, cos, sin)
    assert torch.equal(q_out, hf_q[0].transpose(0, 1))
    assert torch.equal(k_out, hf_k[0].transpose(0, 1))


def test_torch_ops_support_autograd():
    gen = torch.Generator().manual_seed(0)

    def double(*shape):
        return torch.randn(*shape, generator=gen, dtype=torch.float64).requires_grad_()

    x, residual, weight = double(2, 6), double(2, 6), double(6)
    cos, sin = double(2, 4), double(2, 4)
    checks = [
        (lambda x, w: torch_ops.rms_norm(x, w, EPS), (x, weight)),
        (lambda x, r, w: torch_ops.fused_add_rms_norm(x, r, w, EPS), (x, residual, weight)),
        (lambda x, w: torch_ops.multi_rms_norm_cat(x, w, EPS), (x, double(2, 3))),
        (lambda a, b, wa, wb: torch_ops.dual_rms_norm_cat(a, b, wa, wb, EPS), (x, residual, weight, double(6))),
        (torch_ops.silu_and_mul, (x,)),
        (torch_ops.apply_rope, (double(2, 3, 6), double(2, 1, 6), cos, sin)),
    ]
    for function, inputs in checks:
        assert torch.autograd.gradcheck(function, inputs)
