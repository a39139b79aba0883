"""`finetune --store`: training from a capture store without the target's decoder, equal to the in-memory path."""

from __future__ import annotations

import dataclasses
import math
import os
import shutil

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
from safetensors.torch import load_file, save_file  # noqa: E402

import eaglekit.target_model  # noqa: E402
from eaglekit.capture.plan import DataOptions  # noqa: E402
from eaglekit.capture.reader import read_training_store  # noqa: E402
from eaglekit.capture.run import CaptureOptions, capture_store  # noqa: E402
from eaglekit.capture.store import read_manifest  # noqa: E402
from eaglekit.errors import EngineMissing, UsageError  # noqa: E402
from eaglekit.finetune.options import FinetuneOptions  # noqa: E402
from eaglekit.finetune.run import finetune  # noqa: E402
from eaglekit.finetune.train import TrainOptions  # noqa: E402
from eaglekit.runtime.engine import EngineOptions  # noqa: E402
from eaglekit.target import read_target  # noqa: E402
from tests.support import REPO  # noqa: E402
from tests.support.capture import write_prompts  # noqa: E402
from tests.support.engines import stand_in_python  # noqa: E402
from tests.support.factory import make_draft  # noqa: E402
from tests.support.targets import make_target_with_tokenizer  # noqa: E402

pytestmark = pytest.mark.model

VOCAB = 384
AUX = (1, 2, 3)


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    base = tmp_path_factory.mktemp("capture-finetune")
    target = make_target_with_tokenizer(str(base / "target"))
    data = write_prompts(str(base / "prompts.jsonl"), count=16)
    draft = make_draft(str(base / "draft"), "vllm", hidden=64, vocab=VOCAB, draft_vocab=VOCAB, aux_ids=AUX,
                       target_layers=4, fc_norm=True, norm_output=True)
    stores = {}
    for dtype in ("float32", "bfloat16"):
        stores[dtype] = str(base / f"store-{dtype}")
        capture_store(stores[dtype], CaptureOptions(target=target, data=DataOptions(data_file=data), draft=draft,
                                                    shard_tokens=200, store_dtype=dtype))
    # the target as a store's reader needs it: config, tokenizer, and no decoder layer
    head_only = base / "head-only"
    shutil.copytree(target, head_only, ignore=shutil.ignore_patterns("*.safetensors"))
    tensors = load_file(os.path.join(target, "model.safetensors"))
    save_file({n: t for n, t in tensors.items() if ".layers." not in n}, str(head_only / "model.safetensors"))
    return {"base": base, "target": target, "data": data, "draft": draft, "stores": stores,
            "head_only": str(head_only)}


def train_options(env, **changes) -> FinetuneOptions:
    train = TrainOptions(steps=4, batch_tokens=256, depth=2, lr=3e-3, log_every=2, seed=0, precision="fp32")
    cache = {} if "store" in changes else {"cache_dir": str(env["base"] / "cache")}  # a store run captures nothing
    return FinetuneOptions(target=env["target"], data=DataOptions(data_file=env["data"]), train=train, eval=None,
                           validation_fraction=0.0, **cache, **changes)


def test_greedy_labels_from_id_L_equal_the_targets_argmax(env):
    target = eaglekit.target_model.load_target(env["target"])
    data = read_training_store(env["stores"]["float32"], read_target(env["target"]), AUX)
    offsets = data.offsets.tolist()
    for lo, hi in zip(offsets, offsets[1:]):
        logits = target.forward(data.tokens[lo:hi][None], ()).logits[0]
        assert torch.equal(data.labels[lo:hi], logits.argmax(-1))
        ref = target.forward(data.tokens[lo:hi][None], AUX)
        torch.testing.assert_close(data.aux[lo:hi], torch.cat([a[0] for a in ref.aux], -1), rtol=0, atol=0)


def test_finetune_from_a_store_never_loads_the_decoder_and_equals_the_in_memory_run(env, tmp_path, monkeypatch):
    memory = str(tmp_path / "memory")
    finetune(env["draft"], memory, train_options(env))

    def refuse(*args, **kwargs):
        raise AssertionError("the target's decoder was loaded")

    monkeypatch.setattr(eaglekit.target_model, "load_target", refuse)
    stored = str(tmp_path / "stored")
    opts = train_options(env, store=env["stores"]["bfloat16"], max_resident_shards=64)  # one window: every shard
    report = finetune(env["draft"], stored, FinetuneOptions(**{**opts.__dict__, "target": env["head_only"],
                                                                "data": DataOptions()}))
    assert report.data["sequences"] == 16 and report.training["steps"] == 4
    want, got, source = (load_file(os.path.join(p, "model.safetensors")) for p in (memory, stored, env["draft"]))
    assert not torch.equal(want["fc.weight"], source["fc.weight"])  # it trained
    for name in want:
        assert torch.equal(want[name], got[name]), name


def test_soft_targets_are_the_targets_top_k_renormalised_over_the_draft_vocabulary(env):
    from eaglekit.finetune.batches import IGNORE, make_batch, soft_batch

    data = read_training_store(env["stores"]["float32"], read_target(env["target"]), AUX, soft_targets=8)
    target = eaglekit.target_model.load_target(env["target"])
    lo, hi = data.offsets[:2].tolist()
    top = torch.softmax(target.forward(data.tokens[lo:hi][None], ()).logits[0].float(), -1).topk(8)
    assert torch.equal(data.soft_ids[lo:hi], top.indices)
    torch.testing.assert_close(data.soft_probs[lo:hi], top.values, rtol=1e-5, atol=1e-6)
    labelled = data.labels >= 0
    assert torch.equal(data.soft_ids[:, 0][labelled], data.labels[labelled])  # top-1 is the greedy label

    to_draft = torch.arange(VOCAB)
    to_draft[data.soft_ids[lo + 1, 1]] = IGNORE  # the second most likely token after position 1 is not drafted
    _, labels, _, _ = make_batch(data, [0], 2, to_draft)
    ids, probs = soft_batch(data, [0], to_draft, labels)
    valid = labels[0] != IGNORE
    torch.testing.assert_close(probs[0][valid].sum(-1), torch.ones(int(valid.sum())))
    assert float(probs[0][~valid].abs().sum()) == 0
    assert ids[0, 1, 1] == IGNORE and probs[0, 1, 1] == 0
    kept = data.soft_probs[lo + 1, [0, 2]]
    torch.testing.assert_close(probs[0, 1, [0, 2]] / probs[0, 1, 2], kept / kept[1])  # ratios unchanged


def test_one_soft_target_trains_as_the_greedy_label_and_more_train_differently(env, tmp_path):
    opts = train_options(env, store=env["stores"]["float32"], max_resident_shards=64)
    weights = {}
    for k in (0, 1, 8):
        out = str(tmp_path / f"soft-{k}")
        finetune(env["draft"], out, FinetuneOptions(**{**opts.__dict__, "target": env["head_only"],
                                                       "data": DataOptions(), "soft_targets": k}))
        weights[k] = load_file(os.path.join(out, "model.safetensors"))
    for name in weights[0]:
        torch.testing.assert_close(weights[1][name], weights[0][name], rtol=1e-5, atol=1e-6)
    assert not torch.equal(weights[8]["fc.weight"], weights[0]["fc.weight"])
    with pytest.raises(UsageError, match="--soft-targets needs --store"):
        finetune(env["draft"], str(tmp_path / "x"), train_options(env, soft_targets=4))


def test_with_few_resident_shards_an_epoch_reads_each_shard_once(env):
    import random

    from eaglekit.finetune.batches import batch_groups, make_batch

    data = read_training_store(env["stores"]["bfloat16"], read_target(env["target"]), AUX, max_resident=1)
    shards = len(data.aux.shards)
    assert shards >= 4
    stream = batch_groups(data.offsets, 256, random.Random(0), data.aux.window_of(data.offsets[:-1]).tolist())
    seen: list[int] = []
    while len(seen) < data.sequences:  # one epoch: the batches partition the sequences
        group = next(stream)
        _, _, aux, _ = make_batch(data, group, 2, torch.arange(VOCAB))
        assert len(data.aux._cache) == 1 and aux.abs().sum() > 0
        seen += group
    assert sorted(seen) == list(range(data.sequences)) and data.aux.loads == shards


def test_a_store_of_another_target_or_ids_is_refused(env, tmp_path):
    other = make_target_with_tokenizer(str(tmp_path / "other"), seed=1)
    opts = train_options(env, store=env["stores"]["float32"])
    with pytest.raises(UsageError, match="captured from another target: its final norm / lm_head weights differ"):
        finetune(env["draft"], str(tmp_path / "a"), FinetuneOptions(**{**opts.__dict__, "target": other,
                                                                        "data": DataOptions()}))
    draft = make_draft(str(tmp_path / "draft"), "vllm", hidden=64, vocab=VOCAB, draft_vocab=VOCAB, aux_ids=(0, 2, 3),
                       target_layers=4)
    with pytest.raises(UsageError, match=r"not \[0\] that the draft reads"):
        finetune(draft, str(tmp_path / "b"), FinetuneOptions(**{**opts.__dict__, "data": DataOptions()}))
    with pytest.raises(UsageError, match="--store brings its own sequences"):
        finetune(env["draft"], str(tmp_path / "c"), opts)
    assert not os.path.exists(tmp_path / "a") and not os.path.exists(tmp_path / "b")


def test_cli_finetune_and_upgrade_from_a_store(env, tmp_path):
    import json

    import jsonschema

    from tests.support.cli import run_cli

    schema = json.load(open(os.path.join(str(REPO), "schemas",
                                         "finetune-report.schema.json")))
    out = str(tmp_path / "tuned")
    result = run_cli(["finetune", env["draft"], out, "--target", env["head_only"], "--store",
                      env["stores"]["bfloat16"], "--steps", "2", "--batch-tokens", "256", "--no-progress",
                      "--format", "json"])
    assert result.exit_code == 0, result.stderr
    doc = json.loads(result.stdout)
    jsonschema.validate(doc, schema)
    assert doc["options"]["store"] == os.path.basename(env["stores"]["bfloat16"])  # folder names only in reports
    assert os.path.isfile(os.path.join(out, "config.json"))
    assert any("held-out evaluation skipped (--store" in n for n in doc["notes"])
    mixed = run_cli(["finetune", env["draft"], str(tmp_path / "x"), "--target", env["head_only"], "--store",
                     env["stores"]["bfloat16"], "--data", env["data"], "--no-progress"])
    assert mixed.exit_code == 2 and "--store brings its own sequences" in mixed.stderr
    stripped = run_cli(["finetune", env["draft"], str(tmp_path / "y"), "--target", env["head_only"], "--data",
                        env["data"], "--no-progress", "--no-eval"])
    assert stripped.exit_code == 1 and "layers" in stripped.stderr  # without a store the decoder is required
    assert len(stripped.stderr.strip().splitlines()) == 1


def test_a_store_run_is_measured_against_its_source_when_its_target_loads_here(env, tmp_path, monkeypatch):
    """Training from a store needs no decoder, but the paired held-out check decodes with the whole target: it runs
    when the target's folder holds one that fits in memory, and a head-only folder is said to leave the output
    unmeasured."""
    from eaglekit.finetune.evaluate import EvalOptions

    check = EvalOptions(limit=4, max_new_tokens=12, context_tokens=(0,), templates=("chat",))
    opts = train_options(env, store=env["stores"]["bfloat16"], keep_unresolved=True)
    opts = FinetuneOptions(**{**opts.__dict__, "eval": check, "data": DataOptions()})
    report = finetune(env["draft"], str(tmp_path / "measured"), opts)
    (paired,), (before,), (after,) = (report.evaluation[key] for key in ("paired", "before", "after"))
    assert paired["template"] == "chat" and before["prompts"] == after["prompts"] == 4
    assert paired["acceptance_length_difference"] == pytest.approx(after["acceptance_length"]
                                                                   - before["acceptance_length"], abs=1e-3)
    assert report.evaluation["overall"] is not None and "unmeasured" not in report.written
    assert not any("held-out evaluation skipped" in n for n in report.notes)
    unmeasured = finetune(env["draft"], str(tmp_path / "unmeasured"),
                          FinetuneOptions(**{**opts.__dict__, "target": env["head_only"]}))
    assert not unmeasured.evaluation and "unmeasured" in unmeasured.written
    assert any("holds no decoder layers" in n for n in unmeasured.notes)
    import eaglekit.finetune.prepare

    monkeypatch.setattr(eaglekit.finetune.prepare, "free_memory", lambda device: 4096)  # 4 KiB free
    reference_only = dataclasses.replace(check, engine="reference")
    too_large = finetune(env["draft"], str(tmp_path / "too-large"), dataclasses.replace(opts, eval=reference_only))
    assert not too_large.evaluation and any("GiB free" in n for n in too_large.notes)
    missing = EngineOptions(python=str(tmp_path / "no-python"))
    no_engine = finetune(env["draft"], str(tmp_path / "no-engine"), dataclasses.replace(opts, engine=missing))
    assert not no_engine.evaluation and "unmeasured" in no_engine.written
    assert any("GiB free, and --engine vllm: cannot run" in n for n in no_engine.notes), no_engine.notes


SERVED = r"""
import json, sys
request = json.load(open(sys.argv[-2]))
with open(request["draft"] + ".requests.jsonl", "a") as log:  # beside the draft: what the engine was asked
    log.write(json.dumps(request) + "\n")
k, source = request["k"], request["draft"].endswith("/draft")
if request["draft"].endswith("/shifted"):  # vLLM says which layers it captures; here not the draft's own
    print("INFO [eagle.py:1] Using auxiliary layers from speculative config: (0, 1, 2)", file=sys.stderr)
json.dump({"vllm_version": "0.32.0", "tokens": [[7] * request["max_new_tokens"] for _ in request["prompts"]],
           "metrics": {}, "per_request": [histogram(j, k, source) for j in range(len(request["prompts"]))],
           "init_s": 0.1, "generate_s": 0.1}, open(sys.argv[-1], "w"))
"""
HISTOGRAM = """
def histogram(j, k, source):
    # rounds per accepted count 0..k of request j: the source accepts less than the output, and request j's share
    # differs by position, so a condition's figures depend on which requests are its own
    rounds = [0] * (k + 1)
    rounds[0], rounds[1 if source else k] = 1 + j % 2, 2 + j % 5
    return rounds
"""


def test_a_store_run_whose_target_is_too_large_here_is_measured_in_vllm(env, tmp_path, monkeypatch):
    """auto: a target that does not fit this device is served by vLLM, once per draft over every condition's
    prompts, and its per-request counters pair source and output prompt by prompt, condition by condition."""
    import json

    import eaglekit.finetune.prepare
    from eaglekit.decode.metrics import AcceptanceCounter
    from eaglekit.finetune.evaluate import EvalOptions

    monkeypatch.setattr(eaglekit.finetune.prepare, "free_memory", lambda device: 4096)
    namespace: dict = {}
    exec(HISTOGRAM, namespace)
    served = EngineOptions(python=stand_in_python(tmp_path, HISTOGRAM + SERVED))
    check = EvalOptions(limit=10, max_new_tokens=8, context_tokens=(0,), templates=("chat", "raw"))
    opts = train_options(env, store=env["stores"]["bfloat16"], keep_unresolved=True)
    opts = dataclasses.replace(opts, eval=check, data=DataOptions(), engine=served)
    draft = shutil.copytree(env["draft"], str(tmp_path / "draft"))
    report = finetune(draft, str(tmp_path / "out"), opts)
    assert report.evaluation["measured_by"].startswith("measured in vLLM 0.32.0, from its per-request")
    assert any("held-out evaluation in vLLM (--store: the target takes about" in n for n in report.notes)
    with open(draft + ".requests.jsonl", encoding="utf-8") as fh:
        (source_run,) = [json.loads(line) for line in fh]
    assert source_run["k"] == 3 and source_run["max_new_tokens"] == 8 and len(source_run["prompts"]) == 20
    assert source_run["prompts"][:10] != source_run["prompts"][10:]  # chat, then raw
    for index, (before, after) in enumerate(zip(report.evaluation["before"], report.evaluation["after"])):
        assert before["template"] == ("chat", "raw")[index] and before["prompts"] == 10
        for side, source in ((before, True), (after, False)):
            pooled = AcceptanceCounter(3)
            for j in range(10 * index, 10 * index + 10):
                pooled.merge(AcceptanceCounter.from_histogram(namespace["histogram"](j, 3, source)))
            assert side["acceptance_length"] == round(pooled.acceptance_length, 4)
    assert report.evaluation["overall"]["verdict"] == "better" and report.written == "resolved gain"


def test_eval_engine_vllm_is_refused_before_training_where_it_cannot_serve(env, tmp_path):
    from eaglekit.finetune.evaluate import EvalOptions

    opts = train_options(env, store=env["stores"]["bfloat16"])
    opts = dataclasses.replace(opts, eval=EvalOptions(engine="vllm", context_tokens=(0,)), data=DataOptions())
    with pytest.raises(UsageError, match="serves the whole target: its folder holds no decoder layers"):
        finetune(env["draft"], str(tmp_path / "a"), dataclasses.replace(opts, target=env["head_only"]))
    with pytest.raises(EngineMissing, match="cannot run"):
        finetune(env["draft"], str(tmp_path / "b"),
                 dataclasses.replace(opts, engine=EngineOptions(python=str(tmp_path / "no-python"))))
    assert not os.path.exists(tmp_path / "a.checkpoint") and not os.path.exists(tmp_path / "b.checkpoint")


def test_two_gloo_processes_train_from_a_store_as_one_process(env, tmp_path):
    """Two ranks each reading only their own shards (index modulo 2) reach the weights and held-out scores of one
    process holding the same window of shards (twice the resident shards), neither above its RSS + 10 %. The
    weights agree to one rounding of their dtype, and training moved each of them by more than that."""
    import json
    import subprocess
    import sys

    repo = str(REPO)
    # lr 1e-2: three steps move every weight by several roundings of bf16, the dtype the draft is stored in
    common = [env["draft"], "--target", env["head_only"], "--store", env["stores"]["bfloat16"], "--steps", "3",
              "--lr", "1e-2", "--batch-tokens", "256", "--depth", "2", "--precision", "fp32",
              "--validation-fraction", "0.25", "--select-every", "3", "--no-eval", "--no-progress", "--format", "json"]
    environment = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": repo}
    one = subprocess.run([sys.executable, "-m", "eaglekit", "finetune", common[0], str(tmp_path / "one"), *common[1:],
                          "--max-resident-shards", "2"], capture_output=True, text=True, env=environment, timeout=300)
    assert one.returncode == 0, one.stderr[-3000:]
    two = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
                          "--master-addr", "127.0.0.1", "--master-port", "29531", "-m", "eaglekit", "finetune",
                          common[0], str(tmp_path / "two"), *common[1:], "--max-resident-shards", "1"],
                         capture_output=True, text=True, env=environment, timeout=300)
    assert two.returncode == 0, two.stderr[-3000:]
    single, ranked = json.loads(one.stdout)["training"], json.loads(two.stdout)["training"]
    assert ranked["world_size"] == 2
    shards = len(read_manifest(env["stores"]["bfloat16"]).shards)
    assert shards >= 4
    assert single["reading"]["shards_read"] == [list(range(shards))]
    first, second = ranked["reading"]["shards_read"]
    assert first == list(range(0, shards, 2)) and second == list(range(1, shards, 2))  # disjoint, all covered
    assert max(ranked["reading"]["peak_rss_mb"]) <= 1.1 * single["reading"]["peak_rss_mb"][0]
    for a, b in zip(single["validation"], ranked["validation"]):
        assert a["step"] == b["step"]
        assert b["loss"] == pytest.approx(a["loss"], rel=1e-4)
        assert b["accuracy"] == pytest.approx(a["accuracy"], abs=1e-6)
    w0, w1, w2 = (load_file(os.path.join(folder, "model.safetensors"))
                  for folder in (env["draft"], tmp_path / "one", tmp_path / "two"))
    for name in w1:
        # one rounding of the stored dtype at the tensor's largest value: summing the ranks' gradients in another
        # order may flip a last bit, nothing more; the training update itself must be larger than that
        peak = float(w1[name].float().abs().max())
        tolerance = torch.finfo(w1[name].dtype).eps * 2.0 ** math.floor(math.log2(peak))
        update = float((w1[name].float() - w0[name].float()).abs().max())
        assert update > tolerance, (name, update, tolerance)
        torch.testing.assert_close(w2[name].float(), w1[name].float(), rtol=0, atol=tolerance)


def test_compare_in_vllm_from_the_command_line_names_the_engine_in_its_report(env, tmp_path):
    import json

    import jsonschema

    from tests.support.cli import run_cli

    schema = json.load(open(os.path.join(str(REPO), "schemas", "compare-report.schema.json")))
    python = stand_in_python(tmp_path, HISTOGRAM + SERVED)
    draft = shutil.copytree(env["draft"], str(tmp_path / "draft"))
    other = shutil.copytree(env["draft"], str(tmp_path / "other"))
    result = run_cli(["compare", draft, other, "--target", env["target"], "--engine", "vllm", "--engine-python",
                      python, "--limit", "10", "--max-new-tokens", "8", "--template", "chat,raw", "--no-progress",
                      "--format", "json"])
    assert result.exit_code == 0, result.stderr
    doc = json.loads(result.stdout)
    jsonschema.validate(doc, schema)
    assert doc["device"] == "vLLM 0.32.0" and "per-request acceptance counters" in doc["engine"]
    chat, raw = (c["categories"]["all"] for c in doc["conditions"])
    assert chat["b_minus_a"]["verdict"] == raw["b_minus_a"]["verdict"] == "B better"
    assert doc["drafts"]["b"]["aux_layer_ids"] == list(AUX) and "eaglekit reads" not in doc["engine"]
    shifted = shutil.copytree(env["draft"], str(tmp_path / "shifted"))
    read_otherwise = run_cli(["compare", draft, shifted, "--target", env["target"], "--engine", "vllm",
                              "--engine-python", python, "--limit", "10", "--max-new-tokens", "8", "--no-progress",
                              "--format", "json"])
    assert read_otherwise.exit_code == 0, read_otherwise.stderr
    doc = json.loads(read_otherwise.stdout)
    assert doc["drafts"]["b"]["aux_layer_ids"] == [0, 1, 2]  # what the engine did, and eaglekit's reading beside it
    assert "draft B: vLLM captured aux ids [0, 1, 2], eaglekit reads [1, 2, 3]" in doc["engine"]
    refused = run_cli(["compare", draft, other, "--target", env["target"], "--engine", "vllm", "--engine-python",
                       python, "--temperature", "0.7", "--no-progress"])
    assert refused.exit_code == 2 and "--temperature 0.7 with --engine vllm" in refused.stderr
