"""The streaming safetensors writer and the staged (atomic) output folder, on real files."""

from __future__ import annotations

import errno
import json
import os
from pathlib import Path

import numpy as np
import pytest
from safetensors import safe_open

from eaglekit.errors import CheckpointError, OutputError, UsageError
from eaglekit.io import writer
from eaglekit.io.header import read_header
from eaglekit.io.publish import check_destination, publish
from eaglekit.io.writer import (
    ByteRange,
    OutTensor,
    header_bytes,
    patch_header,
    shard_groups,
    write_checkpoint_weights,
    write_safetensors,
)


def load_json(path) -> dict:
    with open(path, encoding="utf-8") as fh:
        return json.load(fh)


def _source(tmp_path, arrays: dict[str, np.ndarray]) -> tuple[str, dict[str, ByteRange]]:
    """A raw file holding the arrays back to back, and the byte range of each."""
    path = str(tmp_path / "raw.bin")
    ranges, offset = {}, 0
    with open(path, "wb") as fh:
        for name, arr in arrays.items():
            data = arr.tobytes()
            fh.write(data)
            ranges[name] = ByteRange(path, offset, offset + len(data))
            offset += len(data)
    return path, ranges


@pytest.fixture
def arrays():
    rng = np.random.default_rng(0)
    return {
        "a.weight": rng.standard_normal((64, 33)).astype(np.float32),
        "b": rng.integers(-5, 5, size=(17,)).astype(np.int64),
        "c": rng.standard_normal((3, 5, 7)).astype(np.float16),
    }


def _out(arrays, ranges) -> list[OutTensor]:
    dtypes = {np.dtype(np.float32): "F32", np.dtype(np.int64): "I64", np.dtype(np.float16): "F16"}
    return [OutTensor(n, dtypes[a.dtype], a.shape, ranges[n]) for n, a in arrays.items()]


def test_raw_copies_read_back_identically_with_the_safetensors_library(tmp_path, arrays):
    _, ranges = _source(tmp_path, arrays)
    out = str(tmp_path / "model.safetensors")
    write_safetensors(out, _out(arrays, ranges), {"format": "pt", "k": "v"})
    with safe_open(out, framework="numpy") as fh:
        assert fh.metadata() == {"format": "pt", "k": "v"}
        assert sorted(fh.keys()) == sorted(arrays)
        for name, arr in arrays.items():
            np.testing.assert_array_equal(fh.get_tensor(name), arr)
    header = read_header(out)
    assert (8 + header.header_size) % 8 == 0


def test_header_is_padded_with_spaces_and_offsets_are_contiguous(arrays, tmp_path):
    _, ranges = _source(tmp_path, arrays)
    raw = header_bytes(_out(arrays, ranges), {"format": "pt"})
    n = int.from_bytes(raw[:8], "little")
    assert len(raw) == 8 + n and n % 8 == 0
    doc = json.loads(raw[8:].decode().rstrip(" "))
    spans = [doc[name]["data_offsets"] for name in arrays]
    assert spans[0][0] == 0 and all(a[1] == b[0] for a, b in zip(spans, spans[1:]))


def test_computed_chunks_may_have_any_size(tmp_path):
    values = np.arange(1000, dtype=np.float32)
    data = values.tobytes()
    def chunks():  # split mid-element
        return [data[:3], data[3:1001], data[1001:]]

    out = str(tmp_path / "m.safetensors")
    write_safetensors(out, [OutTensor("x", "F32", (1000,), chunks)])
    with safe_open(out, framework="numpy") as fh:
        np.testing.assert_array_equal(fh.get_tensor("x"), values)


def test_a_producer_with_the_wrong_length_is_an_error(tmp_path):
    out = str(tmp_path / "m.safetensors")
    with pytest.raises(OutputError, match="produced 8 bytes"):
        write_safetensors(out, [OutTensor("x", "F32", (4,), lambda: [b"\0" * 8])])


def test_a_truncated_source_is_an_error_naming_the_file(tmp_path, arrays):
    path, ranges = _source(tmp_path, arrays)
    os.truncate(path, ranges["a.weight"].end - 10)
    with pytest.raises(CheckpointError, match="truncated") as err:
        write_safetensors(str(tmp_path / "m.safetensors"), _out(arrays, ranges))
    assert path in str(err.value)


@pytest.mark.parametrize("broken", ["copy_file_range", "both"])
def test_copy_falls_back_when_the_kernel_copy_is_unavailable(tmp_path, arrays, monkeypatch, broken):
    def refuse(*args, **kwargs):
        raise OSError(errno.EXDEV if broken == "copy_file_range" else errno.EINVAL, "no")

    monkeypatch.setattr(writer.os, "copy_file_range", refuse, raising=False)
    if broken == "both":
        monkeypatch.setattr(writer.os, "sendfile", refuse)
    _, ranges = _source(tmp_path, arrays)
    out = str(tmp_path / "m.safetensors")
    write_safetensors(out, _out(arrays, ranges))
    with safe_open(out, framework="numpy") as fh:
        for name, arr in arrays.items():
            np.testing.assert_array_equal(fh.get_tensor(name), arr)


def test_progress_counts_every_byte(tmp_path, arrays):
    _, ranges = _source(tmp_path, arrays)
    seen = []
    write_safetensors(str(tmp_path / "m.safetensors"), _out(arrays, ranges), progress=seen.append)
    assert sum(seen) == sum(a.nbytes for a in arrays.values())


def test_shards_and_index(tmp_path, arrays):
    _, ranges = _source(tmp_path, arrays)
    tensors = _out(arrays, ranges)
    limit = arrays["b"].nbytes  # each tensor alone: a is larger than the limit, b + c exceed it
    files = write_checkpoint_weights(str(tmp_path), tensors, {"format": "pt"}, max_shard_size=limit)
    assert list(files) == [f"model-0000{i}-of-00003.safetensors" for i in (1, 2, 3)]
    index = load_json(tmp_path / "model.safetensors.index.json")
    assert index["metadata"]["total_size"] == sum(a.nbytes for a in arrays.values())
    for name, arr in arrays.items():
        with safe_open(str(tmp_path / index["weight_map"][name]), framework="numpy") as fh:
            np.testing.assert_array_equal(fh.get_tensor(name), arr)


def test_shard_groups_keep_order_and_respect_the_limit():
    t = [OutTensor(str(i), "U8", (n,), list) for i, n in enumerate([5, 5, 11, 1, 4])]
    groups = shard_groups(t, 10)
    assert [[x.name for x in g] for g in groups] == [["0", "1"], ["2"], ["3", "4"]]
    assert shard_groups(t, None) == [t]


def test_patch_header_rewrites_metadata_of_equal_length(tmp_path, arrays):
    _, ranges = _source(tmp_path, arrays)
    tensors = _out(arrays, ranges)
    out = str(tmp_path / "m.safetensors")
    write_safetensors(out, tensors, {"h": "0" * 64})
    patch_header(out, tensors, {"h": "f" * 64})
    with safe_open(out, framework="numpy") as fh:
        assert fh.metadata() == {"h": "f" * 64}
        np.testing.assert_array_equal(fh.get_tensor("b"), arrays["b"])
    with pytest.raises(OutputError, match="change size"):
        patch_header(out, tensors, {"h": "f" * 80})


# ---------------------------------------------------------------- staged directory


def _write_file(name: str, text: str):
    """A `write` for publish that puts one file into the staged folder."""
    return lambda stage: Path(stage.path, name).write_text(text)


def test_staged_directory_appears_only_on_publish(tmp_path):
    dst = tmp_path / "out"

    def write(stage):
        Path(stage.path, "f").write_text("x")
        assert not dst.exists()
        assert os.path.basename(stage.path).startswith(".out.eaglekit-partial-")

    publish(str(dst), write, folder=True, replace=False)
    assert (dst / "f").read_text() == "x"
    assert [p.name for p in tmp_path.iterdir()] == ["out"]


def test_failure_leaves_nothing_behind(tmp_path):
    dst = tmp_path / "out"

    def write(stage):
        Path(stage.path, "f").write_text("x")
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError):
        publish(str(dst), write, folder=True, replace=False)
    assert list(tmp_path.iterdir()) == []


def test_a_refused_read_back_leaves_nothing_behind(tmp_path):
    def read_back(stage):
        assert os.listdir(stage.path) == ["f"]
        raise OutputError("fails validation", str(tmp_path / "out"))

    with pytest.raises(OutputError, match="fails validation"):
        publish(str(tmp_path / "out"), _write_file("f", "x"), folder=True, replace=False, read_back=read_back)
    assert list(tmp_path.iterdir()) == []


def test_existing_output_is_refused_without_force_and_replaced_with_it(tmp_path):
    dst = tmp_path / "out"
    dst.mkdir()
    (dst / "old").write_text("old")
    with pytest.raises(UsageError, match="--force"):
        check_destination(str(dst), replace=False)
    publish(str(dst), _write_file("new", "new"), folder=True, replace=True)
    assert sorted(p.name for p in dst.iterdir()) == ["new"]
    assert [p.name for p in tmp_path.iterdir()] == ["out"]


def test_an_empty_existing_directory_is_fine(tmp_path):
    dst = tmp_path / "out"
    dst.mkdir()
    publish(str(dst), _write_file("f", "x"), folder=True, replace=False)
    assert (dst / "f").exists()


def test_a_file_in_the_way_is_refused(tmp_path):
    (tmp_path / "out").write_text("x")
    with pytest.raises(UsageError, match="not a directory"):
        check_destination(str(tmp_path / "out"), replace=False)


def test_leftovers_of_a_killed_run_are_removed(tmp_path):
    dead = tmp_path / ".out.eaglekit-partial-999999999-abcd1234"
    dead.mkdir()
    (dead / "model.safetensors").write_bytes(b"partial")
    alive = tmp_path / f".out.eaglekit-partial-{os.getpid()}-ffff0000"
    alive.mkdir()
    publish(str(tmp_path / "out"), lambda stage: None, folder=True, replace=False)
    assert not dead.exists()
    assert alive.exists()  # another live run's staging is not touched


def test_force_killed_between_its_renames_gets_the_old_output_back(tmp_path):
    """--force moves DST aside, then the new folder in; a kill in between must not lose DST for good."""
    old = tmp_path / ".out.eaglekit-old-999999999-abcd1234"
    old.mkdir()
    (old / "model.safetensors").write_bytes(b"previous output")

    def stop(stage):
        raise UsageError("stop after the stale check")

    with pytest.raises(UsageError):  # the next run finds DST back in place before anything else
        publish(str(tmp_path / "out"), stop, folder=True, replace=True)
    assert (tmp_path / "out" / "model.safetensors").read_bytes() == b"previous output" and not old.exists()
    (tmp_path / ".out.eaglekit-old-999999998-abcd1234").mkdir()  # DST exists: the stale copy just goes
    publish(str(tmp_path / "out"), lambda stage: None, folder=True, replace=True)
    assert sorted(os.listdir(tmp_path)) == ["out"]


def test_interrupted_between_moving_the_old_output_aside_and_publishing_puts_it_back(tmp_path, monkeypatch):
    dst = tmp_path / "out"
    dst.mkdir()
    (dst / "old").write_text("old")
    rename = os.rename

    def interrupted(src, target):  # Ctrl-C as the new folder is about to take the name
        if str(target) == str(dst) and ".eaglekit-partial-" in str(src):
            raise KeyboardInterrupt
        rename(src, target)

    monkeypatch.setattr(os, "rename", interrupted)
    with pytest.raises(KeyboardInterrupt):
        publish(str(dst), _write_file("new", "new"), folder=True, replace=True)
    monkeypatch.undo()
    assert sorted(p.name for p in dst.iterdir()) == ["old"] and os.listdir(tmp_path) == ["out"]


def test_a_full_disk_is_one_line_and_leaves_nothing(tmp_path):
    def full(stage):
        raise OSError(28, "No space left on device")

    with pytest.raises(OutputError, match=r"out: writing the output failed \(No space left on device\); nothing "
                                          "was written"):
        publish(str(tmp_path / "out"), full, folder=True, replace=False)
    assert os.listdir(tmp_path) == []
