"""`eaglekit capture` on a tiny random Llama with its own tokenizer: the store's bytes, resume, refusals, inspect."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys

import jsonschema
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from eaglekit.capture import store as st  # noqa: E402
from eaglekit.capture.run import CaptureOptions, capture_store  # noqa: E402
from eaglekit.errors import CaptureInterrupted, CheckpointError, UsageError  # noqa: E402
from eaglekit.io.header import read_header  # noqa: E402
from eaglekit.target_model import load_target  # noqa: E402
from tests.support import REPO  # noqa: E402
from tests.support.capture import AUX, SHARD_TOKENS, options, write_prompts  # noqa: E402
from tests.support.cli import run_cli  # noqa: E402
from tests.support.progress import Recorder  # noqa: E402
from tests.support.targets import make_target_with_tokenizer  # noqa: E402

pytestmark = pytest.mark.model

SCHEMA = json.load(open(os.path.join(REPO, "eaglekit", "schemas", "capture-report.schema.json")))


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    base = tmp_path_factory.mktemp("capture")
    target = make_target_with_tokenizer(str(base / "target"))
    data = write_prompts(str(base / "prompts.jsonl"))
    return {"base": base, "target": target, "data": data}


def folder_bytes(path: str) -> dict[str, bytes]:
    return {name: open(os.path.join(path, name), "rb").read() for name in sorted(os.listdir(path))}


@pytest.fixture(scope="module")
def whole(env):
    """An uninterrupted float32 capture, the reference every resumed store is compared with."""
    path = str(env["base"] / "whole")
    report = capture_store(path, options(env))
    return path, report


def test_records_hold_the_targets_states_and_shards_are_cut_by_record_and_token_count(env, whole):
    path, report = whole
    manifest = st.read_manifest(path)
    shards = manifest.shards
    assert report.complete and report.shards == len(shards) >= 3 and report.records == 12
    assert manifest.layer_ids.to_dict() == {"convention": "vllm", "aux": list(AUX), "last": 4}
    target = load_target(env["target"])
    plan = st.read_plan(path, manifest)
    for shard in shards:
        tensors = st.read_shard(path, manifest, shard)
        lengths = tensors["offsets"].diff().tolist()
        assert len(lengths) == shard.end_record - shard.first_record and sum(lengths) == shard.tokens
        # a shard ends at the record that brings it to SHARD_TOKENS (the last shard may stop short)
        assert shard is shards[-1] or sum(lengths[:-1]) < SHARD_TOKENS <= sum(lengths)
        for k, record in enumerate(range(shard.first_record, shard.end_record)):
            lo, hi = tensors["offsets"][k], tensors["offsets"][k + 1]
            assert tensors["token_ids"][lo:hi].tolist() == plan[record]
            ref = target.forward(torch.tensor([plan[record]]), (*AUX, 4))
            for j in range(len(AUX)):
                torch.testing.assert_close(tensors["aux"][lo:hi, j], ref.aux[j][0], rtol=0, atol=0)
            torch.testing.assert_close(tensors["last"][lo:hi], ref.aux[-1][0], rtol=0, atol=0)
            assert tensors["loss_mask"][lo:hi].all()


def test_a_sigkilled_capture_resumes_byte_identical(env, whole, tmp_path):
    store = str(tmp_path / "store")
    script = f"""
import json, os, signal, sys
sys.path.insert(0, {str(REPO)!r})
from tests.support.capture import options
from eaglekit.capture.run import capture_store

class KillAfterTwoShards:
    def stage(self, name, total=None, unit=""):
        pass

    def done(self):
        pass

    def advance(self, n=1):
        manifest = os.path.join({store!r}, "manifest.json")
        if os.path.isfile(manifest) and len(json.load(open(manifest))["shards"]) >= 2:
            os.kill(os.getpid(), signal.SIGKILL)

capture_store({store!r}, options({{"target": {env['target']!r}, "data": {env['data']!r}}}),
              progress=KillAfterTwoShards())
"""
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": REPO})
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-2000:]
    killed = st.read_manifest(store)
    assert not killed.complete and len(killed.shards) == 2
    report = capture_store(store, options(env))
    assert report.resumed_from == killed.shards[-1].end_record
    assert report.captured_records == 12 - report.resumed_from
    assert folder_bytes(store) == folder_bytes(whole[0])


def test_an_interrupt_keeps_the_published_shards_and_torn_ones_are_captured_again(env, whole, tmp_path):
    store = str(tmp_path / "store")

    class InterruptAfterThreeShards(Recorder):
        def advance(self, n: int = 1) -> None:
            if os.path.isfile(os.path.join(store, st.MANIFEST)) and len(st.read_manifest(store).shards) >= 3:
                raise KeyboardInterrupt

    with pytest.raises(CaptureInterrupted, match="rerun the same command to resume"):
        capture_store(store, options(env), progress=InterruptAfterThreeShards())
    manifest = st.read_manifest(store)
    shards = manifest.shards
    assert len(shards) == 3
    # a torn last shard (its bytes differ from the manifest's) and a shard file the manifest does not list
    with open(os.path.join(store, shards[2].file), "r+b") as fh:
        fh.truncate(shards[2].bytes // 2)
    shutil.copy(os.path.join(store, shards[0].file), os.path.join(store, st.shard_name(3)))
    with pytest.raises(CheckpointError, match="differs from the manifest"):
        st.read_shard(store, manifest, shards[2])
    report = capture_store(store, options(env))
    assert report.resumed_from == shards[1].end_record
    assert folder_bytes(store) == folder_bytes(whole[0])
    again = capture_store(store, options(env))  # complete: nothing is captured, nothing changes
    assert again.captured_records == 0 and folder_bytes(store) == folder_bytes(whole[0])


def test_a_store_of_another_capture_is_refused_and_force_replaces_it(env, whole, tmp_path):
    store = str(tmp_path / "store")
    shutil.copytree(whole[0], store)
    with pytest.raises(UsageError, match=r"holds another capture \(it differs in layer_ids.aux\)"):
        capture_store(store, options(env, aux_ids=(1, 3)))
    with pytest.raises(UsageError, match="differs in store.dtype"):
        capture_store(store, options(env, store_dtype="bfloat16"))
    assert folder_bytes(store) == folder_bytes(whole[0])
    with st.store_lock(store), pytest.raises(UsageError, match="another capture is writing this store now"):
        capture_store(store, options(env))  # a second capture while the first still runs
    report = capture_store(store, options(env, aux_ids=(1, 3), force=True))
    assert report.resumed_from is None and st.read_manifest(store).layer_ids.aux == (1, 3)
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("mine")
    with pytest.raises(UsageError, match="'notes.txt', which is not part of a hidden-state store"):
        capture_store(str(foreign), options(env, force=True))
    assert os.listdir(foreign) == ["notes.txt"]


def test_fp8_and_bfloat16_stores_keep_the_states_within_their_precision(env, whole, tmp_path):
    held = st.read_manifest(whole[0])
    exact = st.read_shard(whole[0], held, held.shards[0])
    sizes = {}
    for dtype, tolerance in (("bfloat16", 2**-8), ("fp8", 2**-4)):
        store = str(tmp_path / dtype)
        capture_store(store, options(env, store_dtype=dtype))
        manifest = st.read_manifest(store)
        first = manifest.shards[0]
        got = st.read_shard(store, manifest, first)
        scale = exact["aux"].abs().amax(-1, keepdim=True)
        assert ((got["aux"] - exact["aux"]).abs() <= tolerance * scale).all()
        assert torch.equal(got["last"], exact["last"])  # id L stays float32: it decides the labels
        sizes[dtype] = read_header(os.path.join(store, first.file)).entries["aux"]
    assert sizes["fp8"].dtype == "F8_E4M3" and sizes["bfloat16"].dtype == "BF16"
    assert sizes["fp8"].end - sizes["fp8"].start == (sizes["bfloat16"].end - sizes["bfloat16"].start) // 2


def test_cli_json_report_inspect_without_torch_and_the_model_folder_rule(env, whole, tmp_path):
    store = str(tmp_path / "store")
    result = run_cli(["capture", env["target"], store, "--data", env["data"], "--aux-layer-ids", "1,2",
                      "--shard-tokens", str(SHARD_TOKENS), "--store-dtype", "float32", "--no-progress",
                      "--format", "json"])
    assert result.exit_code == 0, result.stderr
    doc = json.loads(result.stdout)
    jsonschema.validate(doc, SCHEMA)
    assert doc["records"] == 12 and doc["complete"] and folder_bytes(store) == folder_bytes(whole[0])
    code = ("import json, sys; from eaglekit.cli.main import main\n"
            "try:\n    main(['inspect', sys.argv[1], '--format', 'json'])\n"
            "except SystemExit as e:\n    assert not e.code, e.code\n"
            "assert 'torch' not in sys.modules\n")
    proc = subprocess.run([sys.executable, "-c", code, store], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": REPO})
    assert proc.returncode == 0, proc.stderr[-2000:]
    shown = json.loads(proc.stdout)
    jsonschema.validate(shown, json.load(open(os.path.join(REPO, "eaglekit", "schemas", "store-inspect.schema.json"))))
    assert shown["kind"] == "hidden-state store" and shown["complete"] and shown["tokens"] == doc["tokens"]
    assert shown["tensors"]["aux"]["shape"][1:] == [2, 64] and not shown["problems"]
    os.truncate(os.path.join(store, st.shard_name(1)), 100)
    torn = run_cli(["inspect", store])
    assert torn.exit_code == 0 and "shard-000001.safetensors: size differs" in torn.stdout
    inside = run_cli(["capture", env["target"], os.path.join(env["target"], "states"), "--data", env["data"],
                      "--no-progress"])
    assert inside.exit_code == 2 and "overlaps the target" in inside.stderr
    other = shutil.copytree(env["target"], tmp_path / "other-model")
    inside = run_cli(["capture", env["target"], str(other / "states"), "--data", env["data"], "--no-progress"])
    assert inside.exit_code == 2 and "lies inside the model folder" in inside.stderr
    assert len(inside.stderr.strip().splitlines()) == 1 and not os.path.exists(other / "states")


def test_vllm_extract_hidden_states_files_import_with_labels_from_id_L(env, tmp_path):
    from safetensors.torch import save_file

    from eaglekit.capture.reader import read_training_store
    from eaglekit.target import read_target

    target = load_target(env["target"])
    files = tmp_path / "vllm"
    files.mkdir()
    sequences = [[5, 17, 42, 99, 7, 3], [8, 9, 10, 11], [100, 200, 300, 12, 13, 14, 15]]
    for n, seq in enumerate(sequences):  # vLLM's layout: [tokens, layers, hidden], slots in ascending id order
        states = torch.stack([s[0] for s in target.forward(torch.tensor([seq]), (1, 2, 4)).aux], dim=1)
        save_file({"hidden_states": states.contiguous(), "token_ids": torch.tensor(seq)},
                  str(files / f"hs_{n}.safetensors"))
    store = str(tmp_path / "store")
    report = capture_store(store, CaptureOptions(target=env["target"], import_dir=str(files), captured_ids=(1, 2, 4),
                                                 store_dtype="float32"))
    assert report.records == 3 and report.layer_ids == {"aux": [1, 2], "last": 4} and report.engine["name"] == "import"
    data = read_training_store(store, read_target(env["target"]), (1, 2))
    for k, seq in enumerate(sequences):
        lo, hi = data.offsets[k], data.offsets[k + 1]
        assert data.tokens[lo:hi].tolist() == seq
        assert torch.equal(data.labels[lo:hi], target.forward(torch.tensor([seq]), ()).logits[0].argmax(-1))
    with pytest.raises(UsageError, match=r"has no id L=4 \(the last layer's output before the final norm\)"):
        capture_store(str(tmp_path / "no-L"), CaptureOptions(target=env["target"], import_dir=str(files),
                                                             captured_ids=(1, 2, 3)))
    assert not os.path.exists(tmp_path / "no-L")
