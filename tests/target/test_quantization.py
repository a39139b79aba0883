"""Served numerics for the reference target: each format's rounding against values computed by hand from its
specification, the layers it applies to, and verify against the quantized SmolLM2 target."""

from __future__ import annotations

import json
import os

import pytest

torch = pytest.importorskip("torch")

from eaglekit.quantization import (  # noqa: E402
    INT4_GROUP,
    SCHEMES,
    fp8_rows,
    int_rows,
    nvfp4_rows,
    nvfp4_weight,
    quantize_linear_layers,
    round_e2m1,
    round_e4m3,
)
from tests.support import REPO  # noqa: E402
from tests.support.cli import run_cli  # noqa: E402

pytestmark = pytest.mark.model

DRAFTERS = os.path.join(REPO, "examples", "drafters")


def values(tensor) -> list[float]:
    return [float(v) for v in tensor.flatten()]


def test_e4m3_rounds_to_nearest_even_and_saturates_at_448():
    x = torch.tensor([17.0, 9.5, 449.0, 1e6, -300.0, 0.1, 0.001, 0.0009, 1.0625])
    # 17: between 16 (mantissa 000) and 18 (001), a tie -> 16; 9.5: 9 (001) / 10 (010) tie -> 10;
    # past 448 saturates; -300: spacing 32 above 256 -> -288; 0.1 = 13 / 128; 0.001 -> the smallest subnormal
    # 2^-9; 0.0009 < 2^-10 -> 0; 1.0625: 1 (000) / 1.125 (001) tie -> 1
    assert values(round_e4m3(x)) == [16.0, 10.0, 448.0, 448.0, -288.0, 13 / 128, 2 ** -9, 0.0, 1.0]


def test_e2m1_rounds_ties_to_the_even_mantissa_and_saturates_at_6():
    x = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 7.0, -0.3, -2.6, 0.0, 0.74])
    assert values(round_e2m1(x)) == [0.0, 1.0, 1.0, 2.0, 2.0, 4.0, 4.0, 6.0, -0.5, -3.0, 0.0, 0.5]


def test_fp8_scales_each_row_by_its_amax():
    x = torch.tensor([[448.0, 17.0, -1.0], [2.0, 1.0, 0.0], [0.0, 0.0, 0.0]])
    # row 2: scale 2 / 448, so 1.0 -> 224 exactly (E4M3 holds 224) -> 1.0
    assert values(fp8_rows(x)) == [448.0, 16.0, -1.0, 2.0, 1.0, 0.0, 0.0, 0.0, 0.0]


def test_nvfp4_blocks_of_16_share_an_e4m3_scale_under_the_tensor_scale():
    w = torch.zeros(1, 48)
    w[0, 0] = 2688.0  # block 1: amax 6 x 448, so the tensor's second-level scale is exactly 1
    w[0, 16:21] = torch.tensor([12.0, 5.0, 2.5, 0.5, 0.26])  # block 2: scale 12 / 6 = 2
    w[0, 32:34] = torch.tensor([13.0, -4.0])  # block 3: 13 / 6 = 2.1667 -> E4M3 2.25
    q = values(nvfp4_weight(w))
    assert q[0] == 2688.0 and q[1:16] == [0.0] * 15
    # 5 / 2 = 2.5 -> 2 (tie to even) -> 4; 2.5 / 2 = 1.25 -> 1 -> 2; 0.5 / 2 = 0.25 -> 0; 0.26 / 2 = 0.13 -> 0
    assert q[16:21] == [12.0, 4.0, 2.0, 0.0, 0.0]
    # 13 / 2.25 = 5.78 -> 6 -> 13.5; -4 / 2.25 = -1.78 -> -2 -> -4.5
    assert q[32:34] == [13.5, -4.5]


def test_nvfp4_activations_take_the_second_level_scale_per_token():
    x = torch.zeros(2, 16)
    x[0, :2] = torch.tensor([2688.0, 1000.0])  # token 1: global scale 1, block scale 448: 1000 / 448 = 2.23 -> 2
    x[1, :2] = torch.tensor([6.0, 2.3])  # token 2 alone: global 6 / 2688, block scale 448 of it: 2.3 -> 2
    assert values(nvfp4_rows(x)[:, :2]) == [2688.0, 896.0, 6.0, 2.0]


def test_int8_is_symmetric_per_output_channel_and_int4_per_group_of_128():
    w = torch.tensor([[1.0, -2.0, 0.5, 127.0], [254.0, 1.0, -3.0, 0.0]])
    # row 1: scale 1, 0.5 -> 0 (half to even); row 2: scale 2, 1 / 2 = 0.5 -> 0, -3 / 2 = -1.5 -> -2 -> -4
    assert values(int_rows(w, 8)) == [1.0, -2.0, 0.0, 127.0, 254.0, 0.0, -4.0, 0.0]
    row = torch.zeros(1, 2 * INT4_GROUP)
    row[0, :2] = torch.tensor([7.0, 3.5])  # group 1: scale 1, 3.5 -> 4
    row[0, INT4_GROUP:INT4_GROUP + 2] = torch.tensor([14.0, 3.0])  # group 2: scale 2, 1.5 -> 2 -> 4
    q = values(int_rows(row, 4, INT4_GROUP))
    assert q[:2] == [7.0, 4.0] and q[INT4_GROUP:INT4_GROUP + 2] == [14.0, 4.0]


def test_weight_only_scales_and_dequantised_weights_are_kept_in_the_models_16_bit_dtype():
    w = torch.tensor([[7.7, 2.0, -0.56, 0.0]])
    # scale 7.7 / 7 = 1.1 is stored as bf16 1.1015625; 7.7 / 1.1015625 = 6.99 -> 7 -> 7.7109375, which bf16
    # (steps of 1/32 in [4, 8)) rounds to 7.71875; 2 -> 1.82 -> 2 -> 2.203125 (exact); -0.56 -> -0.51 -> -1
    assert values(int_rows(w, 4, None, torch.bfloat16)) == [7.71875, 2.203125, -1.1015625, 0.0]
    # fp16 keeps 1.1 as 1.099609375 (10 fraction bits): 7.7 -> 7 -> 7.697265625, halfway between fp16 steps of
    # 1/256 in [4, 8): ties to even, 7 + 178/256
    assert values(int_rows(w, 4, None, torch.float16))[0] == 7.6953125


@pytest.mark.parametrize("name", list(SCHEMES))
def test_the_decoder_linear_layers_compute_with_the_schemes_numerics(name):
    torch.manual_seed(0)
    layer = torch.nn.Sequential(torch.nn.Linear(32, 16), torch.nn.ReLU(), torch.nn.Linear(16, 8))
    original = [m.weight.detach().clone() for m in layer if isinstance(m, torch.nn.Linear)]
    assert quantize_linear_layers([layer], name, torch.bfloat16) == 2
    from eaglekit.quantization import ACTIVATIONS, WEIGHTS

    for module, weight in zip((m for m in layer if isinstance(m, torch.nn.Linear)), original):
        assert torch.equal(module.weight, WEIGHTS[name](weight, torch.bfloat16))
    x = torch.randn(3, 32)
    rounding = ACTIVATIONS.get(name, lambda t: t)
    first = torch.nn.functional.linear(rounding(x), layer[0].weight, layer[0].bias)
    expected = torch.nn.functional.linear(rounding(torch.relu(first)), layer[2].weight, layer[2].bias)
    assert torch.equal(layer(x), expected)


@pytest.fixture(scope="module")
def lossless_draft(tmp_path_factory) -> str:
    from tests.support.smollm2 import smollm2_path

    out = str(tmp_path_factory.mktemp("quantized") / "lossless")
    result = run_cli(["upgrade", os.path.join(DRAFTERS, "smollm2-135m-eagle3"), out, "--target", smollm2_path(),
                      "--no-fc-norm", "--no-norm-output"])
    assert result.exit_code == 0, result.stderr
    return out


@pytest.mark.parametrize("name", ["fp8", "nvfp4"])
def test_verify_is_lossless_against_the_quantized_target_and_names_its_numerics(lossless_draft, name):
    import jsonschema

    from tests.support.smollm2 import smollm2_path

    result = run_cli(["verify", lossless_draft, "--target", smollm2_path(), "--limit", "3", "--max-new-tokens", "32",
                      "--target-quantization", name, "--as-eaglekit-reads", "--format", "json"])
    assert result.exit_code == 0, result.stderr
    doc = json.loads(result.stdout)
    jsonschema.validate(doc, json.load(open(os.path.join(REPO, "eaglekit", "schemas", "verify-report.schema.json"))))
    assert doc["lossless"] and doc["exact_match"] and doc["dtype"] == "float64"
    assert doc["target_quantization"] == SCHEMES[name].to_dict()
    assert 1.0 <= doc["acceptance_length"] <= 4.0


def test_nvfp4_changes_what_the_target_decodes():
    """The emulation is real: the same prompt, greedy, decodes to other tokens under NVFP4."""
    from eaglekit.target_model import load_target
    from tests.support.smollm2 import smollm2_path

    decoded = {}
    for name in (None, "nvfp4"):
        target = load_target(smollm2_path(), dtype="float64", quantization=name)
        ids = target.tokenizer("def fizzbuzz(n):", return_tensors="pt").input_ids
        with torch.no_grad():
            decoded[name] = target.model.generate(ids, max_new_tokens=16, do_sample=False)[0, ids.shape[1]:].tolist()
    assert decoded[None] != decoded["nvfp4"]


def test_a_quantized_target_in_the_engine_is_refused(tmp_path):
    result = run_cli(["verify", os.path.join(DRAFTERS, "smollm2-135m-eagle3"), "--target", str(tmp_path),
                      "--target-quantization", "fp8", "--engine", "both"])
    assert result.exit_code == 2 and "full precision" in result.stderr
