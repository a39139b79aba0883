"""The streaming scan behind --deep: bit-level verdicts equal numpy's on the decoded values, at any chunking."""

from __future__ import annotations

import os
import types

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from eaglekit.families import load_draft
from eaglekit.rules import run_rules
from eaglekit.rules.scan import scan_draft
from eaglekit.spec import TensorRef
from tests.support.factory import make_draft, rewrite_tensors, to_bf16_bits, write_safetensors

SPECIALS = [np.nan, np.inf, -np.inf, 0.0, -0.0, 1.0]


def _encode(values: np.ndarray, dtype: str) -> tuple[bytes, np.ndarray]:
    """Raw bytes in `dtype` and the float64 values those bytes decode to."""
    if dtype == "BF16":
        bits = to_bf16_bits(values.astype(np.float32))
        return bits.tobytes(), (bits.astype(np.uint32) << 16).view(np.float32).astype(np.float64)
    np_dtype = {"F16": "<f2", "F32": "<f4", "F64": "<f8"}[dtype]
    cast = values.astype(np_dtype)
    return cast.tobytes(), cast.astype(np.float64)


@st.composite
def tensors(draw):
    rows, cols = draw(st.integers(1, 6)), draw(st.integers(1, 5))
    dtype = draw(st.sampled_from(["BF16", "F16", "F32", "F64"]))
    fill = draw(st.sampled_from(["random", "constant", "ones", "zeros"]))
    if fill == "random":
        values = np.array(draw(st.lists(st.floats(-4, 4, width=16), min_size=rows * cols, max_size=rows * cols)))
    else:
        values = np.full(rows * cols, {"constant": 0.375, "ones": 1.0, "zeros": 0.0}[fill])
    for _ in range(draw(st.integers(0, 3))):
        values[draw(st.integers(0, rows * cols - 1))] = draw(st.sampled_from(SPECIALS))
    if draw(st.booleans()):  # a whole zero row, possibly straddling chunks
        r = draw(st.integers(0, rows - 1))
        values[r * cols:(r + 1) * cols] = draw(st.sampled_from([0.0, -0.0]))
    return values.reshape(rows, cols), dtype, draw(st.sampled_from([2, 6, 16, 40, 1 << 20]))


def _one_tensor_spec(tmp: str, name: str, dtype: str, shape, raw: bytes):
    path = os.path.join(tmp, "model.safetensors")
    write_safetensors(path, {name: (dtype, tuple(shape), raw)})
    with open(path, "rb") as fh:
        start = 8 + int.from_bytes(fh.read(8), "little")
    ref = TensorRef(name, name, "model.safetensors", dtype, tuple(shape), start, start + len(raw))
    return types.SimpleNamespace(path=tmp, tensors={name: ref})


@settings(max_examples=150, deadline=None)
@given(tensors())
def test_bit_level_verdicts_match_numpy(tmp_path_factory, case):
    values, dtype, chunk = case
    raw, decoded = _encode(values.reshape(-1), dtype)
    decoded = decoded.reshape(values.shape)
    spec = _one_tensor_spec(str(tmp_path_factory.mktemp("t")), "w.weight", dtype, values.shape, raw)
    stats = scan_draft(spec, chunk_bytes=chunk)["w.weight"]

    item = len(raw) // values.size
    words = np.frombuffer(raw, dtype={1: "u1", 2: "<u2", 4: "<u4", 8: "<u8"}[item])
    assert stats.nonfinite == (not np.isfinite(decoded).all())
    assert stats.all_zero == bool((decoded == 0).all())
    assert stats.constant == bool((words == words[0]).all())
    assert stats.all_one == bool((words == words[0]).all() and decoded.reshape(-1)[0] == 1.0)
    assert stats.zero_rows == int((decoded == 0).all(axis=1).sum())


def test_truncated_tensor_bytes_are_a_finding_not_a_crash(tmp_path):
    path = make_draft(str(tmp_path / "d"), "vllm")
    spec = load_draft(path)
    with open(os.path.join(path, "model.safetensors"), "r+b") as fh:
        fh.truncate(spec.tensors["lm_head.weight"].data_start + 10)
    report = run_rules(spec, groups=("deep",), deep=True)
    unreadable = [f for f in report.findings if f.code == "EK414"]
    assert unreadable and all("truncated" in f.message for f in unreadable)
    assert "lm_head.weight" in {f.tensor for f in unreadable}


def test_unscannable_dtype_is_reported_as_unchecked(tmp_path):
    path = make_draft(str(tmp_path / "d"), "vllm")

    def add_fp4(t):
        t["layers.0.mlp.down_proj.weight_packed"] = ("F4", (4, 4), bytes(8))

    rewrite_tensors(path, add_fp4)
    report = run_rules(load_draft(path), groups=("deep",), deep=True)
    assert [(f.code, f.tensor) for f in report.findings] == [("EK415", "layers.0.mlp.down_proj.weight_packed")]


def test_pickle_checkpoints_are_scanned_through_torch(tmp_path):
    torch = pytest.importorskip("torch")
    path = make_draft(str(tmp_path / "d"), "eagle")
    spec = load_draft(path)
    from eaglekit.io.tensors import load_state_dict

    state = {ref.source_name: tensor for ref, tensor in zip(spec.tensors.values(), load_state_dict(spec).values())}
    state["midlayer.mlp.up_proj.weight"][0, 0] = float("nan")
    os.remove(os.path.join(path, "model.safetensors"))
    torch.save(state, os.path.join(path, "pytorch_model.bin"))
    report = run_rules(load_draft(path, allow_pickle=True), groups=("deep",), deep=True)
    assert [(f.code, f.tensor) for f in report.findings] == [("EK401", "layers.0.mlp.up_proj.weight")]


@pytest.mark.parametrize("chunk", [8, 12, 64, 4096])
def test_zero_rows_are_counted_with_rows_longer_than_the_buffer(tmp_path, chunk):
    """A row of a [1, 2^30] tensor must not be buffered whole: rows may span chunks, memory stays at `chunk`."""
    from eaglekit.rules.scan import scan_draft

    head = np.ones((6, 10), np.float32)
    head[[1, 4]] = 0.0
    head[2, 9] = -0.0  # a -0 in a row of ones: not a zero row
    head[3] = -0.0  # all -0 but one tiny value: not a zero row
    head[3, 0] = 1e-30
    path = make_draft(str(tmp_path / "d"), "vllm", dtype="F32", add={"lm_head.weight": head})
    stats = scan_draft(load_draft(path), chunk_bytes=chunk)["lm_head.weight"]
    assert stats.zero_rows == 2 and not stats.all_zero
