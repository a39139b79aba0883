"""The safetensors header parser: every malformed case is one clean CheckpointError, never a crash or a hang."""

import json
import struct

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from safetensors.numpy import save_file

from eaglekit.errors import CheckpointError
from eaglekit.io.header import MAX_HEADER_BYTES, parse_header_bytes, read_header
from tests.support.factory import write_safetensors


def _raw(header: dict, data: bytes = b"") -> bytes:
    body = json.dumps(header).encode()
    return struct.pack("<Q", len(body)) + body + data


def _write(tmp_path, raw: bytes):
    path = tmp_path / "model.safetensors"
    path.write_bytes(raw)
    return str(path)


def test_matches_the_safetensors_library(tmp_path):
    arrays = {"a": np.arange(6, dtype=np.float32).reshape(2, 3), "b": np.ones(4, dtype=np.int64)}
    path = str(tmp_path / "x.safetensors")
    save_file(arrays, path, metadata={"format": "pt"})
    header = read_header(path)
    assert header.metadata == {"format": "pt"}
    assert header.entries["a"].shape == (2, 3) and header.entries["a"].dtype == "F32"
    raw = open(path, "rb").read()
    a = header.entries["a"]
    assert np.frombuffer(raw[a.start:a.end], dtype=np.float32).reshape(2, 3).tolist() == arrays["a"].tolist()


def test_our_writer_produces_exact_bytes(tmp_path):
    path = str(tmp_path / "w.safetensors")
    write_safetensors(path, {"x": ("F16", (2,), np.array([1, 2], dtype="<f2").tobytes())}, {"format": "pt"})
    raw = open(path, "rb").read()
    (n,) = struct.unpack("<Q", raw[:8])
    assert n % 8 == 0
    assert json.loads(raw[8:8 + n]) == {"__metadata__": {"format": "pt"},
                                        "x": {"dtype": "F16", "shape": [2], "data_offsets": [0, 4]}}
    assert raw[8 + n:] == b"\x00\x3c\x00\x40"


@pytest.mark.parametrize(
    "raw, message",
    [
        (b"\x01\x02", "shorter than the 8-byte"),
        (struct.pack("<Q", 10_000) + b"{}", "runs past the end"),
        (struct.pack("<Q", MAX_HEADER_BYTES + 1) + b"{}", "exceeds"),
        (struct.pack("<Q", 5) + b"{nope", "not valid JSON"),
        (struct.pack("<Q", 2) + b"[]", "not a JSON object"),
        (_raw({"t": {"dtype": "F17", "shape": [1], "data_offsets": [0, 4]}}, b"\0" * 4), "unknown dtype"),
        (_raw({"t": {"dtype": "F32", "shape": [2], "data_offsets": [0, 4]}}, b"\0" * 4), "needs 8 bytes"),
        (_raw({"t": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}, b"\0" * 4), "beyond the data section"),
        (_raw({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
               "b": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}}, b"\0" * 12), "overlap"),
        (_raw({"t": {"dtype": "F32", "shape": [-1], "data_offsets": [0, 0]}}), "non-negative"),
        (_raw({"t": {"dtype": "F32", "shape": [1], "data_offsets": [4, 0]}}, b"\0" * 4), "begin <= end"),
        (_raw({"t": [1, 2]}), "not an object"),
        (_raw({"__metadata__": {"a": 1}}), "__metadata__"),
    ],
    ids=["tiny", "length-past-end", "length-bound", "bad-json", "not-object", "unknown-dtype", "size-mismatch",
         "truncated-data", "overlap", "negative-shape", "reversed-offsets", "entry-not-object", "bad-metadata"],
)
def test_malformed_headers_fail_cleanly(tmp_path, raw, message):
    path = _write(tmp_path, raw)
    with pytest.raises(CheckpointError, match=message) as info:
        read_header(path)
    assert str(info.value).startswith(path)
    assert "\n" not in str(info.value)


def _valid_header(entries):
    header, offset = {}, 0
    for i, (dtype, shape) in enumerate(entries):
        size = {"F32": 4, "F16": 2, "BF16": 2, "I64": 8, "BOOL": 1}[dtype]
        n = size * int(np.prod(shape)) if shape else size
        header[f"t{i}"] = {"dtype": dtype, "shape": list(shape), "data_offsets": [offset, offset + n]}
        offset += n
    return header, offset


shapes = st.lists(st.integers(0, 5), max_size=3)
entries = st.lists(st.tuples(st.sampled_from(["F32", "F16", "BF16", "I64", "BOOL"]), shapes), max_size=6)


@settings(max_examples=300, deadline=None)
@given(entries=entries, cut=st.integers(0, 64),
       flips=st.lists(st.tuples(st.integers(0, 400), st.integers(0, 255)), max_size=4))
def test_fuzz_mutated_headers_never_crash(entries, cut, flips):
    header, size = _valid_header(entries)
    raw = bytearray(_raw(header, b"\0" * size))
    for pos, value in flips:
        if pos < len(raw):
            raw[pos] = value
    raw = bytes(raw[: max(0, len(raw) - cut)])
    try:
        parsed = parse_header_bytes(raw, len(raw), "fuzz.safetensors")
    except CheckpointError as exc:
        assert str(exc).startswith("fuzz.safetensors: ")
    else:
        for e in parsed.entries.values():
            assert parsed.data_start <= e.start <= e.end <= len(raw)


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=200))
def test_fuzz_random_bytes_never_crash(blob):
    try:
        parse_header_bytes(blob, len(blob), "random.safetensors")
    except CheckpointError:
        pass
