"""Hostile hidden-state stores: whatever a store folder holds, `capture`, `finetune --store`, `upgrade --store` and
`inspect` answer in one line that names the file and the problem (exit 1; a folder that is no store: 2), in
bounded time, and never remove or change a file of it.

The stores are written through eaglekit's own store writer with random states (tests/support/capture.py) for a
tiny random target, so no model runs (unless a refusal fails); the last test captures a real one.
"""

from __future__ import annotations

import json
import os
import pickle
import shutil
import struct

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from eaglekit.capture import store as st  # noqa: E402
from tests.support.capture import AUX, synthetic_store, write_prompts  # noqa: E402
from tests.support.factory import make_draft  # noqa: E402
from tests.support.hostile import clean  # noqa: E402
from tests.support.targets import make_target_with_tokenizer  # noqa: E402

READ_SECONDS = 60  # a reader imports the training stack before it opens the store
VOCAB = 384  # make_target_with_tokenizer's


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    base = tmp_path_factory.mktemp("hostile-store")
    target = make_target_with_tokenizer(str(base / "target"))  # a capture that went on would run it
    data = write_prompts(str(base / "prompts.jsonl"))
    draft = make_draft(str(base / "draft"), "vllm", hidden=64, vocab=VOCAB, draft_vocab=VOCAB, aux_ids=AUX,
                       k=len(AUX), target_layers=4, dtype="F32", embed=True)
    return {"base": base, "target": target, "data": data, "draft": draft,
            "store": synthetic_store(str(base / "store"), target, data),
            "other": synthetic_store(str(base / "other"), target, data, records=3, seed=1)}


@pytest.fixture
def store(env, tmp_path) -> str:
    """A copy of the intact store, for one test to break."""
    return str(shutil.copytree(env["store"], tmp_path / "store"))


def snapshot(folder: str) -> dict[str, bytes]:
    return {name: open(os.path.join(folder, name), "rb").read() for name in sorted(os.listdir(folder))}


def capture_args(env, store: str, *extra: str) -> list[str]:
    return ["capture", env["target"], store, "--data", env["data"], "--aux-layer-ids", ",".join(map(str, AUX)),
            "--shard-tokens", "16", "--store-dtype", "float32", "--no-progress", *extra]


def shard_readers(env, store: str, out: str) -> dict[str, list[str]]:
    """The commands that read a store's shards."""
    return {"finetune": ["finetune", env["draft"], f"{out}-finetune", "--target", env["target"], "--store", store,
                         "--steps", "1", "--batch-tokens", "32", "--depth", "1", "--no-eval", "--no-progress"],
            "upgrade": ["upgrade", env["draft"], f"{out}-upgrade", "--target", env["target"], "--store", store]}


def refused_in_one_line(args: list[str], code: int, *fragments: str) -> str:
    result = clean(*args, codes=(code,), seconds=READ_SECONDS)
    assert result.stderr.startswith("Error: "), result.stderr
    for fragment in fragments:
        assert fragment in result.stderr, (fragment, result.stderr)
    return result.stderr


def rewrite_manifest(store: str, change) -> None:
    path = os.path.join(store, st.MANIFEST)
    doc = json.load(open(path))
    change(doc)
    with open(path, "w") as fh:
        json.dump(doc, fh)  # NaN and Infinity as Python writes them


# ------------------------------------------------------------------ a folder is a store only by its manifest


@pytest.mark.parametrize("force", [(), ("--force",)], ids=["resume", "force"])
def test_store_file_names_without_a_manifest_are_refused_and_nothing_is_removed(env, tmp_path, force):
    mine = tmp_path / "mine"
    mine.mkdir()
    shutil.copy(os.path.join(env["store"], st.shard_name(0)), mine / st.shard_name(0))  # the user's own copy
    before = snapshot(str(mine))
    refused_in_one_line(capture_args(env, str(mine), *force), 2, str(mine),
                        "'shard-000000.safetensors' but no manifest.json")
    assert snapshot(str(mine)) == before


def test_a_shard_file_the_manifest_does_not_list_and_eaglekit_did_not_write_is_left_alone(env, store):
    with open(os.path.join(store, st.shard_name(7)), "wb") as fh:
        fh.write(b"the user's notes, named like a shard")
    before = snapshot(store)
    refused_in_one_line(capture_args(env, store, "--force"), 2, "'shard-000007.safetensors', which its manifest "
                                                                "does not list and eaglekit did not write")
    assert snapshot(store) == before


# ------------------------------------------------------------------ a manifest's values


def test_a_valid_manifest_reads_and_writes_back_byte_for_byte_keeping_fields_it_does_not_type(store):
    from eaglekit.capture.manifest import Manifest

    path = os.path.join(store, st.MANIFEST)
    written = open(path, "rb").read()
    assert st.read_manifest(store).to_json() == written
    rewrite_manifest(store, lambda doc: (doc["inputs"].update(files=[["a.safetensors", 12]]),
                                         doc["engine"].update(kv_cache_dtype="fp8")))
    doc = json.load(open(path))
    assert json.loads(Manifest.read(doc, path).to_json()) == doc


def _set(path: str, value):
    def change(doc):
        *parents, last = path.split(".")
        node = doc
        for key in parents:
            node = node[int(key)] if isinstance(node, list) else node[key]
        node[int(last) if isinstance(node, list) else last] = value
    return change


MANIFESTS = {
    "bytes NaN": (_set("shards.0.bytes", float("nan")), "shards[0].bytes is nan"),
    "bytes infinite": (_set("shards.0.bytes", float("inf")), "shards[0].bytes is inf"),
    "bytes negative": (_set("shards.0.bytes", -1), "shards[0].bytes is -1"),
    "bytes huge": (_set("shards.0.bytes", 2**62), "shards[0].bytes is 4611686018427387904"),
    "bytes a string": (_set("shards.0.bytes", "19112"), "shards[0].bytes is '19112'"),
    "tokens beyond the bytes": (_set("shards.0.tokens", 2**40), "shards[0].tokens is 1099511627776"),
    "records negative": (_set("shards.0.records", [-1, 4]), "shards[0].records is [-1, 4]"),
    "shard outside the store": (_set("shards.0.file", "../target/model.safetensors"), "shards[0].file is"),
    "aux ids strings": (_set("layer_ids.aux", ["1", "2"]), "layer_ids.aux is ['1', '2']"),
    "aux id past L": (_set("layer_ids.aux", [1, 99]), "layer_ids.aux is [1, 99]"),
    "aux ids NaN": (_set("layer_ids.aux", [float("nan")]), "layer_ids.aux is [nan]"),
    "empty target block": (_set("target", {}), "target.config_sha256 is missing"),
    "empty engine block": (_set("engine", {}), "engine.engine_args is missing"),
    "empty inputs block": (_set("inputs", {}), "inputs.sha256 is missing"),
    "store block a list": (_set("store", []), "store is []: expected an object"),
    "hidden size huge": (_set("target.hidden_size", 2**40), "target.hidden_size is 1099511627776"),
    "hidden size a float": (_set("target.hidden_size", 64.0), "target.hidden_size is 64.0"),
    "planned records negative": (_set("plan.records", -5), "plan.records is -5"),
    "totals disagree": (_set("tokens", 5), "tokens is 5: expected"),
    "complete a string": (_set("complete", "yes"), "complete is 'yes'"),
    "version true": (_set("version", True), "store format version True"),
    "engine argument infinite": (_set("engine.engine_args", {"gpu_memory_utilization": float("inf")}),
                                 "engine.engine_args is"),
}


@pytest.mark.parametrize("case", MANIFESTS, ids=list(MANIFESTS))
def test_a_hostile_manifest_value_is_one_line_naming_the_manifest_for_every_reader(env, store, tmp_path, case):
    change, fragment = MANIFESTS[case]
    rewrite_manifest(store, change)
    before = snapshot(store)
    where = os.path.join(store, st.MANIFEST)
    commands = [["inspect", store], capture_args(env, store), *shard_readers(env, store, str(tmp_path)).values()]
    for args in commands:
        refused_in_one_line(args, 1, where, fragment)
    assert snapshot(store) == before


# ------------------------------------------------------------------ a shard's bytes


def _pickle(path: str, size: int, marker: str) -> None:
    class Executes:
        def __reduce__(self):
            return (os.mkdir, (marker,))  # unpickling it would make the marker folder

    with open(path, "wb") as fh:
        fh.write(pickle.dumps({"aux": Executes()}).ljust(size, b"\0"))


def _torch_save(path: str, size: int, marker: str) -> None:
    torch.save({"aux": torch.zeros(size // 4)}, path)


def _huge_rows(path: str, size: int, marker: str) -> None:
    rows = 2**40
    header = json.dumps({"token_ids": {"dtype": "I64", "shape": [rows], "data_offsets": [0, 8 * rows]}}).encode()
    with open(path, "wb") as fh:
        fh.write(struct.pack("<Q", len(header)) + header + bytes(size))


def _other_store(env):
    def write(path: str, size: int, marker: str) -> None:
        shutil.copy(os.path.join(env["other"], st.shard_name(0)), path)
    return write


SHARDS = {
    "another store's shard": (_other_store, "shard's aux is F32["),
    "a pickle": (lambda env: _pickle, "safetensors header length"),
    "a torch.save archive": (lambda env: _torch_save, "safetensors header length"),
    "a header of 2^40 rows": (lambda env: _huge_rows, "beyond the data section"),
}


@pytest.mark.parametrize("case", SHARDS, ids=list(SHARDS))
def test_a_shard_unlike_its_manifest_is_refused_by_every_reader_even_with_its_hash_listed(env, store, tmp_path, case):
    make, fragment = SHARDS[case]
    path = os.path.join(store, st.shard_name(0))
    marker = str(tmp_path / "unpickled")
    make(env)(path, os.path.getsize(path), marker)
    data = open(path, "rb").read()  # the manifest lists the new bytes: only the tensors can tell
    rewrite_manifest(store, lambda doc: doc["shards"][0].update(bytes=len(data), sha256=st.sha256_bytes(data)))
    before = snapshot(store)
    for args in shard_readers(env, store, str(tmp_path)).values():
        refused_in_one_line(args, 1, path, fragment)
    assert snapshot(store) == before and not os.path.exists(marker)


@pytest.mark.parametrize("where", ["header", "first state", "last byte"])
def test_one_changed_byte_of_a_shard_is_refused_when_read(env, store, tmp_path, where):
    path = os.path.join(store, st.shard_name(1))
    data = bytearray(open(path, "rb").read())
    offset = {"header": 12, "first state": 8 + struct.unpack("<Q", data[:8])[0], "last byte": len(data) - 1}[where]
    data[offset] ^= 0x01
    open(path, "wb").write(data)
    before = snapshot(store)
    for args in shard_readers(env, store, str(tmp_path)).values():
        refused_in_one_line(args, 1, path, "shard differs from the manifest (size or SHA-256)")
    assert snapshot(store) == before


# ------------------------------------------------------------------ a real capture: its data, named and checked


@pytest.mark.model
def test_a_capture_names_its_data_without_a_local_path_and_refuses_other_data_before_any_work(tmp_path,
                                                                                              monkeypatch):
    import eaglekit.capture.run

    target = make_target_with_tokenizer(str(tmp_path / "target"))
    data = write_prompts(str(tmp_path / "prompts.jsonl"), count=3)
    store = str(tmp_path / "store")
    args = ["capture", target, store, "--aux-layer-ids", "1,2", "--shard-tokens", "40", "--no-progress"]
    clean(*args, "--data", data, codes=(0,), seconds=300)
    text = open(os.path.join(store, st.MANIFEST)).read()
    inputs = json.loads(text)["inputs"]
    assert str(tmp_path) not in text and inputs["source"].startswith("prompts.jsonl")
    assert inputs["data"] == {"file": "prompts.jsonl", "sha256": st.sha256_bytes(open(data, "rb").read())}
    captured = snapshot(store)

    def no_work(*args, **kwargs):
        raise AssertionError("the capture began its work")

    monkeypatch.setattr(eaglekit.capture.run, "_engine_source", no_work)
    other = write_prompts(str(tmp_path / "other.jsonl"), count=4)
    refused_in_one_line([*args, "--data", other], 2, store, f"this store was captured from other data: {other} "
                                                            "differs (the store was captured from prompts.jsonl")
    refused_in_one_line(args, 2, "captured from other data: the bundled eaglekit/data/prompts/train.jsonl differs")
    assert snapshot(store) == captured
    monkeypatch.undo()

    plan = bytearray(captured[st.PLAN])
    plan[-1] ^= 0x01
    open(os.path.join(store, st.PLAN), "wb").write(plan)
    changed = snapshot(store)
    refused_in_one_line([*args, "--data", data], 1, store, "planned sequences (sequences.safetensors) are missing "
                                                           "or differ from the manifest")
    assert snapshot(store) == changed

    # killed after publishing its first manifest, before the plan: the rerun starts over and ends as the first run
    rewrite_manifest(store, lambda doc: doc.update(shards=[], records=0, tokens=0, complete=False))
    for name in os.listdir(store):
        if name.startswith(st.SHARD_PREFIX) or name == st.PLAN:
            os.unlink(os.path.join(store, name))
    clean(*args, "--data", data, codes=(0,), seconds=300)
    assert snapshot(store) == captured
