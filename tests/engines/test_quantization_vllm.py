"""eaglekit's int4 against the kernel vLLM serves W4A16 with on CPU (CPUWNA16, `ops.cpu_gemm_wna16`).

Needs vLLM in an environment of its own (scripts/vllm-env.sh writes .vllm-env; or set EAGLEKIT_VLLM_PYTHON). The
weights are packed as a GPTQ / compressed-tensors checkpoint stores them (q + 8 in 4-bit fields of int32, the scale
in the model's 16-bit dtype), repacked with vLLM's own helpers the way its CPU kernel prepares a layer, and
dequantised by the kernel itself (an identity matrix times the weights): every value must be eaglekit's code times
eaglekit's 16-bit scale, rounded to the 16-bit dtype. The kernel rounds that product to nearest even (fp16, and
bf16 on AMX, as eaglekit does) or, for bf16 on its plain AVX-512 path, toward zero.
"""

from __future__ import annotations

import json
import subprocess

import pytest

from tests.support.engines import REPO, VLLM_PYTHON

pytestmark = [pytest.mark.engine,
              pytest.mark.skipif(VLLM_PYTHON is None, reason="no vLLM environment (scripts/vllm-env.sh)")]

KERNEL_CHECK = r"""
import json, sys
import torch
sys.path.insert(0, sys.argv[1])
from eaglekit.quantization import INT4_GROUP, int_rows
from vllm import _custom_ops as ops
from vllm.model_executor.kernels.linear.mixed_precision.cpu import _get_isa_hint
from vllm.model_executor.layers.quantization.utils.quant_utils import (
    pack_quantized_values_into_int32, unpack_quantized_values_into_int32)
from vllm.scalar_type import scalar_types

if not hasattr(torch.ops._C, "cpu_gemm_wna16"):  # vLLM builds the W4A16 kernel for AVX-512 CPUs only
    print(json.dumps({"unavailable": "this CPU's vLLM build has no cpu_gemm_wna16 (AVX-512 only)"}))
    sys.exit(0)
torch.manual_seed(0)
rows, columns = 64, 4 * INT4_GROUP
report = {}
for dtype in (torch.bfloat16, torch.float16):
    w = (torch.randn(rows, columns) * 0.05).to(dtype).float()
    groups = w.reshape(rows, -1, INT4_GROUP)
    scale = (groups.abs().amax(-1) / 7).to(dtype)
    q = torch.round(groups / scale.float().unsqueeze(-1)).clamp(-8, 7).reshape(rows, columns).to(torch.int32) + 8
    packed = torch.zeros(columns // 8, rows, dtype=torch.int32)  # packed along the input dimension
    for j in range(8):
        packed |= q.t()[j::8] << (4 * j)
    unpacked = unpack_quantized_values_into_int32(packed, scalar_types.uint4b8, 0)
    blocked = pack_quantized_values_into_int32(unpacked, scalar_types.uint4b8, 1)
    blocked = blocked.view(columns, -1, 2).permute(1, 0, 2).reshape(-1, columns * 2).contiguous()
    kernel = ops.cpu_gemm_wna16(torch.eye(columns, dtype=dtype), blocked, scale.t().contiguous(), None, None, 8,
                                _get_isa_hint(dtype)).t().float()
    product = ((q - 8).reshape(rows, -1, INT4_GROUP).float() * scale.float().unsqueeze(-1)).reshape(rows, columns)
    toward_zero = (product.view(torch.int32) & ~0xFFFF).view(torch.float32) if dtype == torch.bfloat16 else None
    ours = int_rows(w, 4, INT4_GROUP, dtype)
    report[str(dtype).removeprefix("torch.")] = {
        "isa": _get_isa_hint(dtype),
        "packing_round_trips": bool(torch.equal(unpacked, q.t())),
        "ours_is_the_rounded_product": bool(torch.equal(ours, product.to(dtype).float())),
        "differing": int((kernel != ours).sum()),
        "differing_toward_zero": None if toward_zero is None else int((kernel != toward_zero).sum()),
        "differing_with_exact_scales": int((kernel != int_rows(w, 4, INT4_GROUP)).sum()),
    }
print(json.dumps(report))
"""


def test_vllms_cpu_w4a16_kernel_dequantises_eaglekits_int4_codes_and_16_bit_scales():
    done = subprocess.run([VLLM_PYTHON or "", "-c", KERNEL_CHECK, str(REPO)], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    if "unavailable" in report:
        pytest.skip(report["unavailable"])
    for dtype, found in report.items():
        assert found["packing_round_trips"], dtype
        assert found["ours_is_the_rounded_product"], (dtype, found)
        rounded_toward_zero = dtype == "bfloat16" and found["isa"] != "amx" and found["differing_toward_zero"] == 0
        assert found["differing"] == 0 or rounded_toward_zero, (dtype, found)
        # the 16-bit scales are what makes it exact: with float scales most values would differ
        assert found["differing_with_exact_scales"] > 1000, (dtype, found)
