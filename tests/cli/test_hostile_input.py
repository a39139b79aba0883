"""Hostile and careless input through the real CLI entry point: one line on stderr, exit 0/1/2, bounded time.

"internal error" is main()'s last resort for an input nothing anticipated; these tests require that no input
reaches it, so every class below is handled at its root. Property-based cases use hypothesis over headers,
configs, index files, target configs and prompts; explicit cases cover each class found by hand.
"""

from __future__ import annotations

import json
import math
import os

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from eaglekit.cli.main import one_line
from eaglekit.decode.prompts import read_prompts
from eaglekit.errors import CheckpointError
from eaglekit.io.jsonfile import load_json_object, read_bounded
from tests.support.factory import edit_config, make_draft, make_target_config, pickle_checkpoint, rewrite_tensors
from tests.support.hostile import FUZZ, bounded, clean, refused, strict_json, write_header


def write_config_text(path: str, text: str) -> str:
    with open(os.path.join(path, "config.json"), "w", encoding="utf-8", errors="surrogatepass") as fh:
        fh.write(text)
    return path


# ------------------------------------------------------------------ property-based

NAMES = st.sampled_from(["norm.weight", "fc.weight", "lm_head.weight", "d2t", "layers.0.input_layernorm.weight",
                         "fc_norm.weight", "fc_norm.0.weight", "[/]x", "a\ud800b", "layers.99999999999.x",
                         "__metadata__"])
ANY = st.recursive(
    st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.floats() | st.text(max_size=6),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3),
    max_leaves=6,
)
DTYPE = st.sampled_from(["F32", "BF16", "I64", "BOOL", "F4", "XX"]) | ANY
SHAPE = st.lists(st.integers(0, 5), max_size=3) | ANY
OFFSETS = st.tuples(st.integers(0, 40), st.integers(0, 40)).map(list) | ANY
ENTRY = st.fixed_dictionaries({"dtype": DTYPE, "shape": SHAPE, "data_offsets": OFFSETS}) | ANY


@FUZZ
@given(header=st.dictionaries(NAMES, ENTRY, max_size=4), data=st.binary(max_size=48))
def test_any_safetensors_header(tmp_path_factory, header, data):
    path = write_header(str(tmp_path_factory.mktemp("h")), json.dumps(header), data)
    clean("inspect", path)
    clean("validate", path, "--deep")
    result = clean("inspect", path, "--format", "json")
    if result.exit_code == 0:
        strict_json(result.stdout)


@FUZZ
@given(raw=st.binary(max_size=64))
def test_any_header_bytes(tmp_path_factory, raw):
    path = write_header(str(tmp_path_factory.mktemp("b")), raw)
    clean("validate", path, "--deep")


CONFIG_KEYS = ["architectures", "model_type", "hidden_size", "num_attention_heads", "num_key_value_heads",
               "head_dim", "rms_norm_eps", "rope_theta", "vocab_size", "draft_vocab_size", "num_aux_hidden_states",
               "eagle_aux_hidden_state_layer_ids", "eagle_config", "fc_norm", "norm_output", "target_hidden_size",
               "speculators_config", "transformer_layer_config", "rope_scaling", "max_position_embeddings"]
HUGE = "9" * 5000


@FUZZ
@given(patch=st.dictionaries(st.sampled_from(CONFIG_KEYS), ANY, min_size=1, max_size=4),
       huge=st.sampled_from(CONFIG_KEYS) | st.none(), layout=st.sampled_from(["vllm", "speculators", "specforge"]))
def test_any_config_values(tmp_path_factory, patch, huge, layout):
    root = tmp_path_factory.mktemp("c")
    path = make_draft(str(root / "d"), layout)
    with open(os.path.join(path, "config.json")) as fh:
        cfg = json.load(fh)
    cfg.update(patch)
    text = json.dumps(cfg)
    if huge is not None:
        cfg[huge] = 12345678912345
        text = json.dumps(cfg).replace("12345678912345", HUGE)
    write_config_text(path, text)
    clean("inspect", path)
    result = clean("inspect", path, "--format", "json")
    if result.exit_code == 0:
        strict_json(result.stdout)
    clean("validate", path, "--engine", "all")
    clean("upgrade", path, str(root / "out"), "--dry-run")


@FUZZ
@given(values=st.lists(ANY | st.sampled_from(["model-00001-of-00002.safetensors", "../x", "/etc/passwd", ""]),
                       min_size=1, max_size=4))
def test_any_index_weight_map(tmp_path_factory, values):
    path = make_draft(str(tmp_path_factory.mktemp("i") / "d"), "vllm", shards=2)
    index = os.path.join(path, "model.safetensors.index.json")
    with open(index) as fh:
        doc = json.load(fh)
    for name, value in zip(sorted(doc["weight_map"]), values):
        doc["weight_map"][name] = value
    with open(index, "w") as fh:
        json.dump(doc, fh)
    clean("inspect", path)
    clean("validate", path, "--deep")


TARGET_KEYS = ["num_hidden_layers", "hidden_size", "vocab_size", "architectures", "layer_types", "text_config",
               "tie_word_embeddings", "model_type", "max_position_embeddings", "_name_or_path"]


@FUZZ
@given(patch=st.dictionaries(st.sampled_from(TARGET_KEYS), ANY, min_size=1, max_size=3))
def test_any_target_config(tmp_path_factory, patch):
    root = tmp_path_factory.mktemp("t")
    draft = make_draft(str(root / "d"), "vllm")
    target = edit_config(make_target_config(str(root / "t")), lambda c: c.update(patch))
    clean("validate", draft, "--target", target)
    clean("inspect", draft, "--target", target)
    clean("upgrade", draft, str(root / "out"), "--target", target, "--dry-run")


@FUZZ
@given(lines=st.lists(ANY.map(json.dumps) | st.text(max_size=12) | st.just('{"prompt":' * 3000),
                      min_size=1, max_size=4))
def test_any_prompts_file(tmp_path_factory, lines):
    path = str(tmp_path_factory.mktemp("p") / "prompts.jsonl")
    with open(path, "w", encoding="utf-8", errors="surrogatepass") as fh:
        fh.write("\n".join(lines))
    with bounded():
        try:
            read_prompts(path)
        except CheckpointError as exc:
            assert "\n" not in str(exc)


# ------------------------------------------------------------------ tracebacks, one class each


@pytest.mark.parametrize("header, why", [
    ('{"a": {"dtype": ["F32"], "shape": [1], "data_offsets": [0, 4]}}', "unknown dtype"),
    ('{"a": {"dtype": {"x": 1}, "shape": [1], "data_offsets": [0, 4]}}', "unknown dtype"),
    ('{"a": {"dtype": "F32", "shape": [' + HUGE + '], "data_offsets": [0, 4]}}', "5000 digits"),
    ('{"a":' * 5000 + '1' + '}' * 5000, "nested too deeply"),
    ('{"__metadata__": {}, "__metadata__": {}}', "duplicate key"),
    ('{"__metadata__": false}', "__metadata__"),
    ('{"__metadata__": ["x"]}', "__metadata__"),
])
def test_bad_headers_are_one_line(tmp_path, header, why):
    refused("inspect", write_header(str(tmp_path / "d"), header, b"\0" * 4), contains=why)


@pytest.mark.parametrize("data, why", [(b"\0" * 8, "4 bytes after the last tensor"),
                                       (b"\0" * 4, "")])
def test_validate_deep_applies_safetensors_own_tiling_rule(tmp_path, data, why):
    header = '{"norm.weight": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}'
    path = write_header(str(tmp_path / "d"), header, data)
    if why:
        refused("validate", path, "--deep", contains=why)
    hole = '{"norm.weight": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}}'
    refused("validate", write_header(str(tmp_path / "h"), hole, b"\0" * 8), "--deep", contains="unused bytes")


def test_deep_json_and_huge_integers_in_config(tmp_path):
    path = make_draft(str(tmp_path / "a"), "vllm")
    refused("inspect", write_config_text(path, '{"a":' * 5000 + '1' + '}' * 5000), contains="nested too deeply")
    path = make_draft(str(tmp_path / "b"), "vllm")
    with open(os.path.join(path, "config.json")) as fh:
        text = fh.read().replace('"hidden_size": 64', f'"hidden_size": {HUGE}')
    refused("inspect", write_config_text(path, text), contains="5000 digits")


@pytest.mark.parametrize("name", ["fc_norm.weight", "[/]x", "a\ud800b", "layers.1000000000.input_layernorm.weight"])
def test_odd_tensor_names(tmp_path, name):
    path = make_draft(str(tmp_path / "d"), "vllm", add={name: np.ones(64, np.float32)})
    for args in (["inspect", path], ["inspect", path, "--format", "json", "--tensors"], ["validate", path, "--deep"],
                 ["upgrade", path, str(tmp_path / "out")]):
        clean(*args)  # each within the hang bound: a layer id of 10^9 makes no loop or list of that length


@pytest.mark.parametrize("value", ["[/]x", "[bold]red[/bold]", "a\ud800b"])
def test_printed_strings_are_never_markup_and_always_encodable(tmp_path, value):
    path = edit_config(make_draft(str(tmp_path / "d"), "vllm"), lambda c: c.update(model_type=value))
    result = clean("inspect", path)
    if "\ud800" not in value:
        assert value in result.stdout


def test_paths_with_brackets_are_shown_as_they_are(tmp_path):
    path = make_draft(str(tmp_path / "[bold]red"), "vllm")
    assert "[bold]red" in clean("inspect", path).stdout
    (tmp_path / "a[").mkdir()
    out = str(tmp_path / "a[/b]")  # the folder b] inside a[
    result = clean("upgrade", path, out, codes=(0,))
    assert os.path.isdir(out) and "a[/b]" in result.stdout


@pytest.mark.parametrize("value", [5, None, [1, 2], ["model.safetensors"]])
def test_index_values_of_the_wrong_type(tmp_path, value):
    path = make_draft(str(tmp_path / "d"), "vllm", shards=2)
    index = os.path.join(path, "model.safetensors.index.json")
    with open(index) as fh:
        doc = json.load(fh)
    doc["weight_map"][sorted(doc["weight_map"])[0]] = value
    with open(index, "w") as fh:
        json.dump(doc, fh)
    refused("inspect", path, contains="index")


@pytest.mark.parametrize("patch, why", [
    ({"hidden_size": 0}, "positive integer"), ({"hidden_size": math.inf}, "positive integer"),
    ({"hidden_size": "64"}, "positive integer"), ({"architectures": 5}, "architectures"),
    ({"layer_types": [1, 2]}, "layer_types"), ({"num_hidden_layers": None}, "num_hidden_layers"),
])
def test_target_configs_of_the_wrong_type(tmp_path, patch, why):
    target = edit_config(make_target_config(str(tmp_path / "t")), lambda c: c.update(patch))
    refused("validate", make_draft(str(tmp_path / "d"), "vllm"), "--target", target, contains=why)


@pytest.mark.parametrize("key", ["rms_norm_eps", "rope_theta"])
def test_nan_in_a_config_gives_valid_json_and_a_finding(tmp_path, key):
    path = edit_config(make_draft(str(tmp_path / "d"), "vllm"), lambda c: c.update({key: math.nan}))
    assert strict_json(clean("inspect", path, "--format", "json").stdout).get(key, None) is None
    doc = strict_json(clean("validate", path, "--format", "json", codes=(1,)).stdout)
    assert "EK157" in {f["code"] for f in doc["findings"]}


def test_engine_versions_older_than_modelled_are_refused(tmp_path):
    path = make_draft(str(tmp_path / "d"), "vllm", fc_norm=True)
    refused("validate", path, "--engine", "vllm", "--engine-version", "0.1", code=2, contains="0.21.0")


# ------------------------------------------------------------------ hangs and memory


def _fifo(path: str) -> str:
    os.mkfifo(path)
    return path


@pytest.mark.parametrize("which", ["config.json", "model.safetensors", "model.safetensors.index.json"])
def test_a_fifo_where_a_file_is_read_never_blocks(tmp_path, which):
    path = make_draft(str(tmp_path / "d"), "vllm", shards=2 if which.endswith("index.json") else 1)
    os.remove(os.path.join(path, which)) if os.path.exists(os.path.join(path, which)) else None
    _fifo(os.path.join(path, which))
    refused("inspect", path, contains="not a regular file")


def test_a_fifo_as_target_config_or_prompts_never_blocks(tmp_path):
    target = str(tmp_path / "t")
    os.makedirs(target)
    _fifo(os.path.join(target, "config.json"))
    refused("validate", make_draft(str(tmp_path / "d"), "vllm"), "--target", target, contains="not a regular file")
    prompts = _fifo(str(tmp_path / "p.jsonl"))
    with bounded(), pytest.raises(CheckpointError, match="not a regular file"):
        read_prompts(prompts)


def test_devices_and_oversized_files_are_not_read(tmp_path):
    with bounded(), pytest.raises(CheckpointError, match="not a regular file"):
        read_bounded("/dev/zero", "config.json")
    big = tmp_path / "config.json"
    big.write_bytes(b" " * 1024)
    with pytest.raises(CheckpointError, match="bound"):
        read_bounded(str(big), "config.json", limit=512)
    with pytest.raises(CheckpointError, match="folder"):
        load_json_object(str(tmp_path), "config.json")


def test_target_config_symlinked_out_of_its_hub_cache_folder_is_refused(tmp_path):
    outside = make_target_config(str(tmp_path / "elsewhere"))
    target = tmp_path / "models--org--t" / "snapshots" / "0123abc"  # fetched from the Hub: links stay inside
    target.mkdir(parents=True)
    os.symlink(os.path.join(outside, "config.json"), target / "config.json")
    refused("validate", make_draft(str(tmp_path / "d"), "vllm"), "--target", str(target), contains="symlink")


def test_billion_layer_header_is_refused_in_bounded_time(tmp_path):
    path = make_draft(str(tmp_path / "d"), "vllm")
    rewrite_tensors(path, lambda t: t.update({"layers.100000000.input_layernorm.weight": ("F32", (1,), b"\0" * 4)}))
    refused("inspect", path, contains="at most")  # within the hang bound: no list of 10^8 layers is built


# ------------------------------------------------------------------ secrets


def test_secrets_never_reach_a_message(tmp_path, monkeypatch):
    token = "hf_" + "A1b2C3d4" * 4
    monkeypatch.setenv("HF_TOKEN", token)
    result = refused("inspect", str(tmp_path / f"missing-{token}"))
    assert token not in result.stderr and "***" in result.stderr
    assert one_line(f"server said: Authorization: Bearer {token}x\nsecond line", []) == \
        "server said: Authorization: ***\\nsecond line"
    assert "s3cr3t-value" not in one_line("echo s3cr3t-value", ["push", "--token", "s3cr3t-value"])


# ------------------------------------------------------------------ wrong data


def test_fp16_cast_that_would_overflow_is_refused_and_writes_nothing(tmp_path):
    from tests.support.rule_cases import array

    fc = array("fc.weight")
    fc[0, 0] = 1.0e5  # a bf16 value float16 cannot hold
    path = make_draft(str(tmp_path / "d"), "vllm", add={"fc.weight": fc})
    out = tmp_path / "out"
    refused("upgrade", path, str(out), "--dtype", "fp16", contains="beyond float16")
    assert not out.exists() and sorted(os.listdir(tmp_path)) == ["d"]
    clean("upgrade", path, str(tmp_path / "ok"), "--dtype", "fp32", codes=(0,))


def test_unsorted_aux_ids_never_claim_a_preserved_function(tmp_path):
    path = make_draft(str(tmp_path / "d"), "vllm")
    refused("upgrade", path, str(tmp_path / "a"), "--aux-layer-ids", "9,6,2", code=2, contains="not ascending")
    def unsort(cfg):
        cfg["eagle_aux_hidden_state_layer_ids"] = cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] = [9, 6, 2]

    unsorted = edit_config(make_draft(str(tmp_path / "u"), "vllm"), unsort)
    doc = strict_json(clean("upgrade", unsorted, str(tmp_path / "b"), "--no-fc-norm", "--no-norm-output",
                            "--format", "json", codes=(0,)).stdout)
    assert doc["function"] == "approximate" and any("unsorted" in c for c in doc["changes"])
    assert doc["aux"]["ids"] == [2, 6, 9]


def test_a_pickle_with_a_complex_tensor_is_one_line(tmp_path):
    torch = pytest.importorskip("torch")
    source = make_draft(str(tmp_path / "src"), "eagle")
    path = pickle_checkpoint(str(tmp_path / "bin"), source, {"fc.weight": torch.zeros(4, 4, dtype=torch.complex64)})
    refused("inspect", path, "--allow-pickle", contains="complex64")


def test_a_non_utf8_output_name(tmp_path):
    path = make_draft(str(tmp_path / "d"), "vllm")
    out = os.path.join(str(tmp_path), os.fsdecode(b"out-\xff"))
    clean("upgrade", path, out, codes=(0,))
    assert os.path.isdir(out)
    strict_json(clean("upgrade", path, out + "2", "--format", "json", codes=(0,)).stdout)
