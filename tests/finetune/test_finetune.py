"""`eaglekit finetune` on a tiny random target with its own small tokenizer and chat template: real training, real
bytes, at a vocabulary small enough that the tests measure the loop, not a 49k-wide head."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys

import jsonschema
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
from safetensors import safe_open  # noqa: E402
from safetensors.torch import load_file, save_file  # noqa: E402

from eaglekit.capture.plan import DataOptions  # noqa: E402
from eaglekit.errors import (  # noqa: E402
    CheckpointError,
    EaglekitError,
    TrainingInterrupted,  # noqa: E402
    UsageError,
)
from eaglekit.families import load_draft  # noqa: E402
from eaglekit.finetune.options import FinetuneOptions  # noqa: E402
from eaglekit.finetune.run import finetune  # noqa: E402
from eaglekit.finetune.train import TrainOptions  # noqa: E402
from eaglekit.target import read_target  # noqa: E402
from tests.support import REPO  # noqa: E402
from tests.support.cli import run_cli as run  # noqa: E402
from tests.support.factory import make_draft  # noqa: E402
from tests.support.smollm2 import smollm2_path  # noqa: E402
from tests.support.targets import make_target_with_tokenizer  # noqa: E402

pytestmark = pytest.mark.model

SCHEMA = json.load(open(os.path.join(str(REPO), "schemas", "finetune-report.schema.json")))
VOCAB = 384  # tests.support.targets.make_target_with_tokenizer's byte-level BPE


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    base = tmp_path_factory.mktemp("finetune")
    target = make_target_with_tokenizer(str(base / "target"))
    # the full vocabulary: a random target's greedy tokens spread over all of it
    draft = make_draft(str(base / "draft"), "vllm", hidden=64, vocab=VOCAB, draft_vocab=VOCAB, aux_ids=(1, 2, 4),
                       target_layers=4, fc_norm=True, norm_output=True)
    data = base / "data.jsonl"
    data.write_text("\n".join(json.dumps({"text": f"def f{i}(x):\n    return x * {i} + {i * i}\n" * (1 + i % 3)})
                              for i in range(16)) + "\n")
    return {"base": base, "target": target, "draft": draft, "data": str(data), "cache": str(base / "cache")}


def options(env, **changes) -> FinetuneOptions:
    train = dict(steps=8, batch_tokens=256, depth=3, lr=3e-3, log_every=2, seed=0)
    train.update(changes.pop("train", {}))
    data = DataOptions(**{"data_file": env["data"], **changes.pop("data", {})})
    changes.setdefault("cache_dir", env["cache"])
    changes.setdefault("validation_fraction", 0.0)  # these tests check the training loop itself, not the selection
    return FinetuneOptions(target=env["target"], data=data, train=TrainOptions(**train), eval=None, **changes)


def captured(env, aux_ids, **data):
    """finetune's training data for `aux_ids`, captured through capture/ into the cache store (or read back)."""
    from eaglekit.finetune.data import captured_data

    opts = FinetuneOptions(target=env["target"], data=DataOptions(data_file=env["data"], **data),
                           cache_dir=env["cache"])
    return captured_data(read_target(env["target"]), tuple(sorted(aux_ids)), opts, "cpu")


def weights(path: str) -> dict[str, torch.Tensor]:
    return load_file(os.path.join(path, "model.safetensors"))


def test_loss_decreases_and_the_output_reads_back_as_the_source_did(env, tmp_path):
    out = str(tmp_path / "out")
    report = finetune(env["draft"], out, options(env, train={"steps": 20}))
    history = report.training["history"]
    assert history[-1]["loss"] < 0.8 * history[0]["loss"]
    source, tuned = load_draft(env["draft"]), load_draft(out)
    assert tuned.flags == source.flags and tuned.aux.ids == source.aux.ids and set(tuned.tensors) == set(source.tensors)
    before, after = weights(env["draft"]), weights(out)
    assert {n: t.dtype for n, t in before.items()} == {n: t.dtype for n, t in after.items()}
    assert not torch.equal(before["fc.weight"], after["fc.weight"])
    assert not torch.equal(before["fc_norm.0.weight"], after["fc_norm.0.weight"])
    provenance = tuned.config["eaglekit"]
    assert provenance["command"] == "finetune" and provenance["function"] == "trained"
    assert provenance["steps"] == 20 and provenance["data"]["sha256"] == report.data["sha256"]
    with safe_open(os.path.join(out, "model.safetensors"), "pt") as fh:
        assert json.loads(fh.metadata()["eaglekit"]) == provenance
    assert not os.path.exists(out + ".checkpoint")  # the implicit checkpoint folder goes with success


def test_the_output_holds_every_trained_tensor_as_trained_fused_projections_included(env, tmp_path, monkeypatch):
    """The drafter computes q|k|v and gate|up as one fused GEMM each, the checkpoint keeps them as separate tensors:
    every tensor the run trained is written from the drafter's state, split back into the file's tensors, never
    copied from the source."""
    from eaglekit.finetune import output

    written = {}
    real = output.out_tensors

    def remembering(spec, drafter, trained):
        written.update(drafter.state_dict())
        return real(spec, drafter, trained)

    monkeypatch.setattr(output, "out_tensors", remembering)
    out = str(tmp_path / "out")
    report = finetune(env["draft"], out, options(env, train={"steps": 4}))
    trained = set(report.training["trained_tensors"])
    before, after = weights(env["draft"]), weights(out)
    parts = {f"layers.0.self_attn.{p}_proj.weight" for p in "qkv"} | {f"layers.0.mlp.{p}_proj.weight"
                                                                      for p in ("gate", "up")}
    assert parts <= trained <= set(after)
    for name in trained:
        assert torch.equal(after[name], written[name].to(after[name].dtype)), name
        assert not torch.equal(before[name], after[name]), name


def test_auto_precision_is_bf16_only_where_the_device_computes_it_natively(env, tmp_path, monkeypatch):
    from eaglekit.finetune.train import resolve_precision

    report = finetune(env["draft"], str(tmp_path / "out"), options(env, train={"steps": 1, "precision": "auto"}))
    assert report.options["train"]["precision"] == resolve_precision("auto", "cpu") in ("bf16", "fp32")
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: False)
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: False)
    assert resolve_precision("auto", "cpu") == "fp32" and resolve_precision("bf16", "cpu") == "bf16"
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: True)
    assert resolve_precision("auto", "cpu") == "bf16" and resolve_precision("fp32", "cpu") == "fp32"


def test_frozen_groups_are_copied_bit_for_bit(env, tmp_path):
    out = str(tmp_path / "out")
    report = finetune(env["draft"], out, options(env, train={"freeze": ("fc", "layers", "head", "embed")}))
    assert set(report.training["trained_tensors"]) == {"fc_norm.0.weight", "fc_norm.1.weight", "fc_norm.2.weight"}
    before, after = weights(env["draft"]), weights(out)
    changed = {n for n in before if not torch.equal(before[n], after[n])}
    assert changed == {"fc_norm.0.weight", "fc_norm.1.weight", "fc_norm.2.weight"}


def test_captured_data_is_a_store_in_the_cache_reused_by_a_rerun_and_a_damaged_shard_is_captured_again(env,
                                                                                                        tmp_path):
    cache = str(tmp_path / "cache")
    first = finetune(env["draft"], str(tmp_path / "a"), options(env, cache_dir=cache, train={"steps": 1}))
    assert not first.data["reused"] and os.path.isfile(os.path.join(first.data["cache"], "manifest.json"))
    second = finetune(env["draft"], str(tmp_path / "b"), options(env, cache_dir=cache, train={"steps": 1}))
    assert second.data["reused"] and second.data["sha256"] == first.data["sha256"]
    assert second.data["cache"] == first.data["cache"] and os.listdir(cache) == [os.path.basename(first.data["cache"])]
    shard = sorted(n for n in os.listdir(first.data["cache"]) if n.startswith("shard"))[0]
    with open(os.path.join(first.data["cache"], shard), "r+b") as fh:  # a torn write: the shard is cut short
        fh.truncate(os.path.getsize(fh.name) // 2)
    third = finetune(env["draft"], str(tmp_path / "c"), options(env, cache_dir=cache, train={"steps": 1}))
    assert not third.data["reused"] and third.data["sha256"] == first.data["sha256"]
    other = finetune(env["draft"], str(tmp_path / "d"),
                     options(env, cache_dir=cache, data={"max_length": 8}, train={"steps": 1}))
    assert other.data["sha256"] != first.data["sha256"] and other.data["cache"] != first.data["cache"]


def test_interrupt_saves_a_checkpoint_and_resume_equals_an_uninterrupted_run(env, tmp_path):
    whole = str(tmp_path / "whole")
    finetune(env["draft"], whole, options(env))

    def interrupt(done, record, live):
        if done == 3:
            raise KeyboardInterrupt

    out, ckpt = str(tmp_path / "out"), str(tmp_path / "ckpt")
    with pytest.raises(TrainingInterrupted, match="after step 3/8; checkpoint saved"):
        finetune(env["draft"], out, options(env, checkpoint_dir=ckpt), on_step=interrupt)
    assert not os.path.exists(out) and os.listdir(ckpt) == ["step-0000003"]
    assert not [n for n in os.listdir(tmp_path) if "partial" in n]
    tampered = str(tmp_path / "tampered")  # a one-element tensor would broadcast over the matrix and train on
    shutil.copytree(ckpt, tampered)
    weights_file = os.path.join(tampered, "step-0000003", "weights.safetensors")
    save_file({**load_file(weights_file), "fc.weight": torch.zeros(1)}, weights_file)
    with pytest.raises(CheckpointError, match=f"^{weights_file}: fc.weight is F32\\[1\\], this run trains it as F32"):
        finetune(env["draft"], out, options(env, checkpoint_dir=tampered, resume=True))
    assert not os.path.exists(out) and os.listdir(tampered) == ["step-0000003"]
    report = finetune(env["draft"], out, options(env, checkpoint_dir=ckpt, resume=True))
    assert report.training["resumed_from"] == 3 and report.training["steps"] == 8
    assert [r["step"] for r in report.training["history"]] == [2, 4, 6, 8]
    resumed, uninterrupted = weights(out), weights(whole)
    for name in uninterrupted:
        assert torch.equal(resumed[name], uninterrupted[name]), name

    with pytest.raises(UsageError, match="belongs to another run"):
        finetune(env["draft"], str(tmp_path / "x"), options(env, checkpoint_dir=ckpt, resume=True,
                                                             train={"lr": 1e-3}))


def test_two_gloo_processes_train_as_one_process_on_the_same_global_batch(env, tmp_path):
    common = [env["draft"], "--target", env["target"], "--data", env["data"], "--cache-dir", env["cache"],
              "--steps", "4", "--batch-tokens", "512", "--depth", "3", "--lr", "3e-3", "--precision", "fp32",
              "--no-eval", "--no-progress", "--format", "json"]
    environment = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": REPO}
    one = subprocess.run([sys.executable, "-m", "eaglekit", "finetune", common[0], str(tmp_path / "one"), *common[1:]],
                         capture_output=True, text=True, env=environment, timeout=300)
    assert one.returncode == 0, one.stderr
    two = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
                          "--master-addr", "127.0.0.1", "--master-port", "29517", "-m", "eaglekit", "finetune",
                          common[0], str(tmp_path / "two"), *common[1:]],
                         capture_output=True, text=True, env=environment, timeout=300)
    assert two.returncode == 0, two.stderr[-3000:]
    doc_one = json.loads(one.stdout)
    doc_two = json.loads(two.stdout)  # only the main rank reports
    assert doc_two["training"]["world_size"] == 2
    for a, b in zip(doc_one["training"]["history"], doc_two["training"]["history"]):
        assert a["loss"] == pytest.approx(b["loss"], rel=1e-4)
    w1, w2 = weights(str(tmp_path / "one")), weights(str(tmp_path / "two"))
    for name in w1:
        torch.testing.assert_close(w2[name].float(), w1[name].float(), rtol=0, atol=1e-2 * float(w1[name].float()
                                                                                           .abs().max() + 1e-6))


def test_cli_report_is_schema_valid_with_held_out_evaluation_and_a_plot(env, tmp_path):
    out = str(tmp_path / "out")
    result = run(["finetune", env["draft"], out, "--target", env["target"], "--data", env["data"], "--cache-dir",
                  env["cache"], "--steps", "4", "--batch-tokens", "256", "--eval-limit", "2", "--eval-max-new-tokens",
                  "6", "--eval-context-tokens", "0,48", "--eval-templates", "chat,raw", "--keep-unresolved", "--plot",
                  "--no-progress", "--format", "json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.output)
    jsonschema.validate(doc, SCHEMA)
    assert [(e["template"], e["context_tokens"]) for e in doc["evaluation"]["after"]] == [
        ("chat", 0), ("chat", 48), ("raw", 0), ("raw", 48)]
    assert doc["evaluation"]["overall"]["conditions"] == 4 and doc["evaluation"]["overall"]["prompts"] == 2
    assert doc["plot"] == f"{tmp_path.name}/out-finetune.png"  # its folder and file name: no local path
    assert str(tmp_path) not in result.output
    with open(out + "-finetune.png", "rb") as fh:
        assert fh.read(8) == b"\x89PNG\r\n\x1a\n"
    human = run(["finetune", env["draft"], str(tmp_path / "h"), "--target", env["target"], "--data", env["data"],
                 "--cache-dir", env["cache"], "--steps", "2", "--batch-tokens", "256", "--eval-limit", "1",
                 "--eval-max-new-tokens", "4", "--eval-context-tokens", "0", "--eval-templates", "chat",
                 "--keep-unresolved", "--no-progress"])
    assert human.exit_code == 0 and "Held-out τ" in human.output and "eaglekit verify" in human.output
    assert "without a resolved gain" in human.output


def test_progress_lines_without_a_terminal(env, tmp_path, monkeypatch):
    import eaglekit.cli.progress

    monkeypatch.setattr(eaglekit.cli.progress, "QUIET_START_S", 0.0)  # this run is shorter than the quiet start
    result = run(["finetune", env["draft"], str(tmp_path / "out"), "--target", env["target"], "--data", env["data"],
                  "--cache-dir", str(tmp_path / "cache"), "--steps", "4", "--batch-tokens", "256", "--no-eval",
                  "--format", "json"])
    assert result.exit_code == 0
    assert re.search(r"finetune: capturing target states on [\d,]+ tokens \(16 sequences\)$", result.stderr, re.M)
    assert "finetune: step 4: loss" in result.stderr


def test_vllm_captured_hidden_states_train_without_loading_the_target(env, tmp_path):
    from eaglekit.target_model import load_target

    target = load_target(env["target"])
    folder = tmp_path / "captured"
    folder.mkdir()
    for i in range(6):
        ids = torch.randint(0, VOCAB, (12 + i,), generator=torch.Generator().manual_seed(i))
        states = target.forward(ids[None], [1, 2, 4]).aux  # the layers vLLM was told to capture
        save_file({"hidden_states": torch.stack([s[0] for s in states], 1).to(torch.bfloat16), "token_ids": ids},
                  str(folder / f"hs_{i}.safetensors"))
    out = str(tmp_path / "out")
    report = finetune(env["draft"], out, FinetuneOptions(
        target=env["target"], import_dir=str(folder),
        train=TrainOptions(steps=3, batch_tokens=64, depth=2)))
    assert report.data["sequences"] == 6 and report.data["positions"] == sum(12 + i for i in range(6))
    assert "evaluation skipped" in report.notes[0] and os.path.isdir(out)


@pytest.mark.parametrize("content, message", [
    (b'{"text": "ok"}\n{"text": \n', "line 2 is not valid JSON"),
    (b"\n\n", "no prompts in the file"),
    (b"\xff\xfe\x00", "not UTF-8"),
    (b'{"text": ""}\n', "encodes to"),
    (b'{"other": 1}\n', "needs"),
])
def test_bad_data_files_fail_with_one_line(env, tmp_path, content, message):
    bad = tmp_path / "bad.jsonl"
    bad.write_bytes(content)
    result = run(["finetune", env["draft"], str(tmp_path / "out"), "--target", env["target"], "--data", str(bad),
                  "--cache-dir", str(tmp_path / "cache"), "--no-eval", "--no-progress"])
    assert result.exit_code == 1
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0] and str(bad) in lines[0], result.stderr
    assert not os.path.exists(tmp_path / "out")


def test_usage_errors(env, tmp_path):
    base = ["finetune", env["draft"], str(tmp_path / "out"), "--target", env["target"], "--no-progress"]
    for extra, message in ((["--steps", "-1"], "--steps must not be negative"),
                           (["--freeze", "fc,wings"], "unknown group"),
                           (["--validation-fraction", "1"], "--validation-fraction must lie in [0, 1)"),
                           (["--freeze", "fc,fc_norm,layers,head,embed", "--no-eval"], "leaves nothing to train"),
                           (["--eval-context-tokens", "0,500"], "--eval-context-tokens 500, 64 new tokens and -k 3"),
                           (["--depth-decay", "nan"], "--depth-decay nan: expected a number in (0, 1]"),
                           (["--depth-decay", "0.001", "--depth", "16"], "vanishes in float32"),
                           (["--checkpoint-every", "-1", "--no-eval"], "--checkpoint-every must not be negative"),
                           (["--no-eval", "--eval-context-tokens", "-5"], "--eval-context-tokens '-5'"),
                           (["--captured-ids", "1,2,4"], "give --import too"),
                           (["--seed", str(2**64)], "torch takes seeds from -2^63 to 2^64 - 1"),
                           (["--resume", "--data", env["data"], "--cache-dir", env["cache"], "--no-eval"],
                            "no checkpoint to resume from")):
        result = run(base + extra)
        assert result.exit_code == 2 and message in result.stderr, (extra, result.stderr)
    specforge = make_draft(str(tmp_path / "sf"), "specforge", hidden=64, vocab=VOCAB, draft_vocab=256,
                           aux_ids=(1, 2, 3), target_layers=4)
    result = run(["finetune", specforge, str(tmp_path / "o2"), "--target", env["target"], "--no-progress"])
    assert result.exit_code == 2 and "eaglekit upgrade" in result.stderr


def test_warm_start_keeps_every_logit_and_feeds_back_the_eagle3_state_rescaled(env, tmp_path):
    """norm_output switched on by upgrade: after the warm start the first step's logits equal the EAGLE-3
    source's and the fed-back state is the source's pre-norm state times a positive per-row scalar."""
    from eaglekit.drafter.model import Drafter
    from eaglekit.drafter.unroll import unrolled_steps
    from eaglekit.finetune import warm_start
    from eaglekit.target_model import load_target
    from eaglekit.upgrade import UpgradeOptions, upgrade

    source = make_draft(str(tmp_path / "e3"), "vllm", hidden=64, vocab=VOCAB, draft_vocab=VOCAB, aux_ids=(1, 2, 4),
                        target_layers=4, dtype="F32")
    upgraded = str(tmp_path / "up")
    config_only = tmp_path / "config-only"  # no weights: upgrade cannot rescale, the output is a plain warm start
    config_only.mkdir()
    shutil.copy(os.path.join(env["target"], "config.json"), config_only / "config.json")
    warm_only = UpgradeOptions(target=str(config_only), fc_norm=False, norm_output=True)
    assert upgrade(source, upgraded, warm_only).function == "warm-start"
    target = load_target(env["target"])
    data = captured(env, (1, 2, 4))

    def drafter(path):
        return Drafter.from_spec(load_draft(path), embed_tokens=target.embed_tokens, lm_head=target.lm_head)

    eagle3, tuned = drafter(source), drafter(upgraded)
    with_weights = upgrade(source, str(tmp_path / "up-rescaled"), UpgradeOptions(target=env["target"], fc_norm=False))
    assert with_weights.function == "eagle3-function"  # upgrade set the start up itself: nothing left to do here
    rescaled = warm_start.apply(drafter(str(tmp_path / "up-rescaled")), load_draft(str(tmp_path / "up-rescaled")),
                                data, "auto")
    c = with_weights.start.scale  # the head and norm it rescaled keep their relative step sizes
    assert not rescaled.changed
    assert rescaled.lr_scales == {"norm.weight": pytest.approx(c, rel=1e-5),
                                  "lm_head.weight": pytest.approx(1 / c, rel=1e-5)}
    warm = warm_start.apply(tuned, load_draft(upgraded), data, "auto")
    assert warm.changed == {"norm.weight", "lm_head.weight"} and "pre-norm RMS" in warm.notes[0]
    c = float(tuned.norm.weight.detach()[0])
    assert warm.lr_scales == {"norm.weight": pytest.approx(c), "lm_head.weight": pytest.approx(1 / c)}
    assert warm_start.apply(drafter(upgraded), load_draft(upgraded), data, "none") == warm_start.WarmStart()
    lo, hi = int(data.offsets[3]), int(data.offsets[4])
    ids, aux = data.tokens[lo + 1:hi][None], data.aux[lo:hi - 1].float()[None]
    with torch.no_grad():
        a = next(unrolled_steps(eagle3, ids, eagle3.combine(aux), 1))
        b = next(unrolled_steps(tuned, ids, tuned.combine(aux), 1))
    torch.testing.assert_close(b.draft_logits, a.draft_logits, rtol=1e-4, atol=1e-4 * float(a.draft_logits.abs().max()))
    cosine = torch.nn.functional.cosine_similarity(b.feedback, a.feedback, dim=-1)
    assert float(cosine.min()) > 1 - 1e-5
    ratio = b.feedback.norm(dim=-1) / a.feedback.norm(dim=-1)
    torch.testing.assert_close(ratio, c / a.feedback.pow(2).mean(-1).sqrt(), rtol=1e-3, atol=0)


def test_warm_start_fits_unit_fc_norm_weights(env, tmp_path):
    from eaglekit.drafter.model import Drafter
    from eaglekit.finetune import warm_start
    from eaglekit.target_model import load_target
    from eaglekit.upgrade import UpgradeOptions, upgrade

    source = make_draft(str(tmp_path / "e3"), "vllm", hidden=64, vocab=VOCAB, draft_vocab=VOCAB, aux_ids=(1, 2, 4),
                        target_layers=4, dtype="F32")
    upgraded = str(tmp_path / "up")
    upgrade(source, upgraded, UpgradeOptions(target=env["target"], fc_norm_init="ones", norm_output=False))
    target = load_target(env["target"])
    data = captured(env, (1, 2, 4))
    spec = load_draft(upgraded)
    tuned = Drafter.from_spec(spec, embed_tokens=target.embed_tokens, lm_head=target.lm_head)
    eagle3 = Drafter.from_spec(load_draft(source), embed_tokens=target.embed_tokens, lm_head=target.lm_head)
    aux = data.aux.float()[None]
    with torch.no_grad():
        want, ones = eagle3.combine(aux), tuned.combine(aux)
        warm = warm_start.apply(tuned, spec, data, "auto")
        fitted = tuned.combine(aux)
    assert warm.changed == {"fc_norm.0.weight", "fc_norm.1.weight", "fc_norm.2.weight"}
    assert "least squares" in warm.notes[0]
    assert (fitted - want).norm() < 0.5 * (ones - want).norm()


def test_help_does_not_import_torch():
    code = ("import sys\nfrom eaglekit.cli.main import main\ntry:\n    main(['finetune', '--help'])\n"
            "except SystemExit:\n    pass\nassert 'torch' not in sys.modules, 'torch imported'")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert "--import" in result.stdout and "torchrun" in result.stdout


# ---------------------------------------------------------------- never worse than the source


@pytest.fixture(scope="module")
def oracle(tmp_path_factory):
    """A target whose greedy token is one token forever and a draft that always drafts it (τ = k + 1): a source
    any damaging fine-tune is measurably worse than (bench/gpu_smoke.py's pair)."""
    from bench.gpu_smoke import build_draft, build_target

    base = tmp_path_factory.mktemp("oracle")
    target, draft = str(base / "target"), str(base / "draft")
    build_target(target, hidden=64, layers=8, vocab=64)
    build_draft(draft, target, eagle31=True)
    data = base / "data.jsonl"
    data.write_text("\n".join(json.dumps({"text": " ".join(f"w{(i * j) % 60 + 2}" for j in range(40))})
                              for i in range(12)) + "\n")
    return {"target": target, "draft": draft, "data": str(data), "cache": str(base / "cache")}


def oracle_options(oracle, **changes) -> FinetuneOptions:
    train = dict(steps=6, batch_tokens=256, depth=3, lr=2e-4, log_every=2, seed=0, select_every=2)
    train.update(changes.pop("train", {}))
    data = DataOptions(**{"data_file": oracle["data"], **changes.pop("data", {})})
    changes.setdefault("cache_dir", oracle["cache"])
    changes.setdefault("eval", None)
    return FinetuneOptions(target=oracle["target"], data=data, train=TrainOptions(**train), **changes)


def _held_out_that_favours_the_start(env):
    """(target, training data, held-out data): held-out labels that the untrained drafter predicts exactly (its own
    first-step top-1), training labels that are the target's, so every step of training moves away from the
    held-out part."""
    import dataclasses

    from eaglekit.drafter.unroll import unrolled_steps
    from eaglekit.target_model import load_target

    target = load_target(env["target"])
    data = captured(env, (1, 2, 4))
    drafter = _drafter(env, target)
    own = data.labels.clone()
    offsets = data.offsets.tolist()
    with torch.no_grad():
        for lo, hi in zip(offsets, offsets[1:]):
            ids, aux = data.tokens[lo + 1:hi][None], data.aux[lo:hi - 1].float()[None]
            first = next(unrolled_steps(drafter, ids, drafter.combine(aux), 1))
            own[lo + 1:hi] = first.logits[0].argmax(-1)
    return target, data, dataclasses.replace(data, labels=own)


def _drafter(env, target):
    from eaglekit.drafter.model import Drafter

    return Drafter.from_spec(load_draft(env["draft"]), embed_tokens=target.embed_tokens, lm_head=target.lm_head)


SELECTING = TrainOptions(steps=6, batch_tokens=256, depth=3, lr=3e-3, select_every=2)


def test_selection_keeps_the_start_when_training_only_hurts_the_held_out_sequences(env):
    from eaglekit.finetune.train import train

    target, data, held_out = _held_out_that_favours_the_start(env)
    drafter = _drafter(env, target)
    start = {n: p.detach().clone() for n, p in drafter.named_parameters()}
    result = train(drafter, data, SELECTING, validation=held_out)
    scores = result.validation
    assert [v.step for v in scores] == [0, 2, 4, 6] and scores[0].accuracy[0] > 0.95  # bf16 autocast: near-ties
    assert result.selected_step == 0 and scores[0].score > max(v.score for v in scores[1:])
    assert all(torch.equal(p, start[n]) for n, p in drafter.named_parameters())  # the start, bit for bit


def test_a_resumed_run_keeps_the_step_an_uninterrupted_run_keeps(env, tmp_path):
    """Interrupted at step 3, after the start scored best: the checkpoint carries every held-out score and the best
    weights, so the resumed run still returns the start, bit for bit, with the uninterrupted run's scores."""
    from eaglekit.finetune.checkpoints import Checkpoints
    from eaglekit.finetune.train import train

    target, data, held_out = _held_out_that_favours_the_start(env)
    whole = train(_drafter(env, target), data, SELECTING, validation=held_out)
    checkpoints = Checkpoints(str(tmp_path / "ckpt"), 0, "run")

    def interrupt(done, record, live):
        if done == 3:
            raise KeyboardInterrupt

    with pytest.raises(TrainingInterrupted, match="after step 3/6; checkpoint saved"):
        train(_drafter(env, target), data, SELECTING, validation=held_out, checkpoints=checkpoints, on_step=interrupt)
    drafter = _drafter(env, target)
    start = {n: p.detach().clone() for n, p in drafter.named_parameters()}
    resumed = train(drafter, data, SELECTING, validation=held_out, checkpoints=checkpoints, resume=True)
    assert resumed.resumed_from == 3 and resumed.selected_step == whole.selected_step == 0
    assert resumed.validation == whole.validation
    assert all(torch.equal(p, start[n]) for n, p in drafter.named_parameters())


def _eval(**kw):
    from eaglekit.finetune.evaluate import EvalOptions

    return EvalOptions(**{"limit": 6, "max_new_tokens": 16, "context_tokens": (0,), **kw})


def test_a_finetune_resolved_worse_on_smollm2_writes_nothing_and_says_why(tmp_path):
    """The bundled EAGLE-3 drafter on SmolLM2 retrained from scratch for two steps: resolved worse, not written."""
    from eaglekit.upgrade import UpgradeOptions, upgrade

    target = smollm2_path()
    source = str(tmp_path / "e3")
    upgrade(os.path.join(REPO, "examples", "drafters", "smollm2-135m-eagle3"), source,
            UpgradeOptions(target=target, fc_norm=False, norm_output=False))
    out = str(tmp_path / "out")
    common = ["--target", target, "--data-limit", "8", "--cache-dir", str(tmp_path / "cache"), "--from-scratch",
              "--steps", "2", "--validation-fraction", "0", "--eval-limit", "10", "--eval-max-new-tokens", "24",
              "--eval-context-tokens", "0", "--eval-templates", "chat", "--no-progress"]
    result = run(["finetune", source, out, *common])
    assert result.exit_code == 1, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "no gain found" in lines[0] and "worse with chat" in lines[0], lines
    assert not os.path.exists(out) and sorted(os.listdir(tmp_path)) == ["cache", "e3"]


def test_the_replayed_decode_counts_rounds_as_a_chain_decode_does(oracle):
    """Rounds over a run of greedy text: accept the leading hits, continue after the bonus token; the oracle draft
    replays at τ = k + 1 on its target's own answers, and text that is not the target's greedy text has no round."""
    from eaglekit.drafter.model import Drafter
    from eaglekit.finetune.batches import draft_label_map
    from eaglekit.finetune.replay import greedy_runs, replay_tau, rounds_accepted
    from eaglekit.target_model import load_target

    assert greedy_runs([5, 1, 2, 3, 9, 4], [1, 2, 3, 7, 4, 0]) == [(0, 2), (4, 4)]
    hits = torch.tensor([[1, 1, 0], [1, 1, 1], [1, 0, 0], [0, 0, 0], [1, 1, 1], [1, 1, 1], [1, 1, 1]],
                        dtype=torch.bool)
    assert rounds_accepted(hits, [(0, 6)], 3) == [2, 0, 3]  # rows 0, 3, 4
    assert rounds_accepted(hits, [(0, 5)], 3) == [2, 0]  # a round needs its rows i..i+2 inside the run

    target = load_target(oracle["target"])
    drafter = Drafter.from_spec(load_draft(oracle["draft"]), embed_tokens=target.embed_tokens, lm_head=target.lm_head)
    answers = captured(oracle, load_draft(oracle["draft"]).aux.ids, generate=12)
    replayed = replay_tau(drafter, answers, 3, 256, draft_label_map(drafter))
    assert replayed is not None and replayed.acceptance_length == 4.0 and replayed.rounds >= 12 * 2
    text = captured(oracle, load_draft(oracle["draft"]).aux.ids)
    assert replay_tau(drafter, text, 3, 256, draft_label_map(drafter)) is None


def test_a_finetune_without_a_resolved_gain_is_not_written_and_keep_unresolved_writes_it_and_says_so(oracle,
                                                                                                      tmp_path):
    """A source that already drafts every token right (τ = k + 1) cannot gain: one line with what was measured,
    exit 1, no output; with --keep-unresolved it is written and its report, provenance and push say so."""
    out = str(tmp_path / "out")
    common = ["--target", oracle["target"], "--data", oracle["data"], "--cache-dir", oracle["cache"], "--from-scratch",
              "--steps", "1", "--batch-tokens", "256", "--depth", "3", "--lr", "1.0", "--validation-fraction", "0",
              "--eval-limit", "10", "--eval-max-new-tokens", "16", "--eval-context-tokens", "0,8", "--no-progress"]
    result = run(["finetune", oracle["draft"], out, *common])
    assert result.exit_code == 1, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "no gain found, nothing was written" in lines[0], lines
    assert "held-out τ 4.000 → " in lines[0] and "resolves ±" in lines[0] and "--keep-unresolved" in lines[0]
    assert not os.path.exists(out) and not os.path.exists(out + ".checkpoint")

    result = run(["finetune", oracle["draft"], out, *common, "--keep-unresolved", "--format", "json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    jsonschema.validate(doc, SCHEMA)
    overall = doc["evaluation"]["overall"]
    assert overall["verdict"] == "not resolved" and overall["before"] == 4.0 and overall["conditions"] == 6
    assert doc["written"] == "without a resolved gain (--keep-unresolved)"
    assert any("--keep-unresolved" in n for n in doc["notes"])
    provenance = load_draft(out).config["eaglekit"]
    assert provenance["written"] == doc["written"] and provenance["held_out_gain"]["verdict"] == "not resolved"

    from eaglekit.hub.push import push

    with pytest.raises(EaglekitError, match="did not measure better than its source"):
        push(out, "org/worse", dry_run=True)


@pytest.fixture(scope="module")
def misdrafting(oracle, tmp_path_factory):
    """The oracle draft with its fc negated: it drafts the wrong token every time (τ = 1), which training with a
    working learning rate repairs and a learning rate too small to move it does not."""
    from safetensors.torch import load_file, save_file

    draft = str(tmp_path_factory.mktemp("misdrafting") / "draft")
    shutil.copytree(oracle["draft"], draft)
    tensors = load_file(os.path.join(draft, "model.safetensors"))
    tensors["fc.weight"] = -tensors["fc.weight"]
    save_file(tensors, os.path.join(draft, "model.safetensors"), metadata={"format": "pt"})
    return draft


@pytest.mark.parametrize("lr, gains", [(1e-2, True), (1e-6, False)])
def test_only_a_resolved_gain_is_written(oracle, misdrafting, tmp_path, lr, gains):
    out = str(tmp_path / "out")
    result = run(["finetune", misdrafting, out, "--target", oracle["target"], "--data", oracle["data"],
                  "--cache-dir", oracle["cache"], "--steps", "60", "--batch-tokens", "256", "--depth", "3",
                  "--lr", str(lr), "--eval-limit", "10", "--eval-max-new-tokens", "16", "--eval-context-tokens", "0",
                  "--eval-templates", "chat", "--no-progress", "--format", "json"])
    if gains:
        assert result.exit_code == 0, result.output
        overall = json.loads(result.stdout)["evaluation"]["overall"]
        assert overall["before"] == 1.0 and overall["after"] > 3.0 and overall["interval"]["low"] > 0
        assert load_draft(out).config["eaglekit"]["written"] == "resolved gain"
        from eaglekit.hub.card import build_card

        doc = json.loads(result.stdout)
        card = build_card(load_draft(out), "org/tuned")
        section = card.split("## Fine-tuning", 1)[1].split("\n## ", 1)[0]
        assert f"τ 1.00 → {overall['after']:.2f}, difference {overall['acceptance_length_difference']:+.3f}" in section
        assert f"[{overall['interval']['low']:+.3f}, {overall['interval']['high']:+.3f}], better" in section
        assert f"on {doc['data']['sequences']} sequences" in section and "k = 3" in section
        assert f"step {doc['training']['selected_step']}" in section and "written: resolved gain" in section
        assert "| chat | 0 |" in section
    else:
        assert result.exit_code == 1 and "no gain found, nothing was written" in result.stderr
        assert "held-out τ 1.000 → 1.000" in result.stderr and not os.path.exists(out)


def test_a_finetune_that_cannot_beat_its_source_is_refused_from_the_held_out_scores_without_decoding(
        oracle, tmp_path, monkeypatch):
    """The oracle draft already drafts every token right: no training step scores above it on the held-out
    sequences, so selection keeps its own weights and finetune says so at once, without decoding a copy of its
    input against it; exit 1, nothing written."""
    import eaglekit.finetune.run as finetune_run

    def no_decode(*args, **kwargs):
        raise AssertionError("an output equal to its source was decoded against it")

    monkeypatch.setattr(finetune_run, "_paired_evaluation", no_decode)
    out = str(tmp_path / "out")
    result = run(["finetune", oracle["draft"], out, "--target", oracle["target"], "--data", oracle["data"],
                  "--cache-dir", oracle["cache"], "--steps", "6", "--batch-tokens", "256", "--depth", "3", "--lr",
                  "1.0", "--validation-fraction", "0.25", "--select-every", "2", "--eval-limit", "10",
                  "--eval-max-new-tokens", "16", "--eval-context-tokens", "0", "--no-progress"])
    assert result.exit_code == 1, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "no gain found, nothing was written: no training step scored above the source" \
        in lines[0], lines
    assert "(teacher-forced chain score: the source 4.000 (loss " in lines[0] and ", best training step " in lines[0]
    assert "the output would equal its input (--keep-unresolved writes it anyway)" in lines[0]
    assert not os.path.exists(out) and not os.path.exists(out + ".checkpoint")


def test_from_scratch_reinitialises_what_it_trains_and_keeps_the_vocabulary_map(env, tmp_path):
    out = str(tmp_path / "out")
    draft = make_draft(str(tmp_path / "src"), "vllm", hidden=64, vocab=VOCAB, draft_vocab=256, aux_ids=(1, 2, 4),
                       target_layers=4, fc_norm=True, norm_output=True, embed=True, frequency_ordered=True)
    report = finetune(draft, out, options(env, from_scratch=True, train={"steps": 0}))
    assert any("--from-scratch" in n for n in report.notes)
    before, after = weights(draft), weights(out)
    assert torch.equal(before["d2t"], after["d2t"]) and torch.equal(before["embed_tokens.weight"],
                                                                    after["embed_tokens.weight"])
    assert torch.all(after["norm.weight"] == 1) and torch.all(after["fc_norm.0.weight"] == 1)
    assert not torch.equal(before["fc.weight"], after["fc.weight"])
    assert float(after["fc.weight"].float().std()) == pytest.approx(0.02, rel=0.1)


def test_a_run_killed_while_its_output_is_measured_leaves_no_output(env, tmp_path):
    """SIGTERM (what timeout and schedulers send) while the staged output is paired with its source: no OUT, no
    staging folder, no checkpoint folder left beside it."""
    import signal
    import time

    out = tmp_path / "out"
    args = [sys.executable, "-m", "eaglekit", "finetune", env["draft"], str(out), "--target", env["target"], "--data",
            env["data"], "--cache-dir", env["cache"], "--steps", "2", "--batch-tokens", "256", "--validation-fraction",
            "0", "--eval-limit", "16",
            "--eval-max-new-tokens", "64", "--eval-context-tokens", "0"]
    proc = subprocess.Popen(args, stderr=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": REPO})
    deadline = time.monotonic() + 300
    for line in proc.stderr:
        if "held-out evaluation" in line or time.monotonic() > deadline:
            break
    assert "held-out evaluation" in line  # the staged output exists and is being measured
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == 128 + signal.SIGTERM
    assert os.listdir(tmp_path) == []


def test_finetune_captures_from_the_quantized_target_and_names_its_numerics(env, tmp_path):
    cache = str(tmp_path / "cache")
    full = finetune(env["draft"], str(tmp_path / "full"), options(env, cache_dir=cache, train={"steps": 1}))
    served = finetune(env["draft"], str(tmp_path / "int4"), options(env, cache_dir=cache, train={"steps": 1},
                                                                    target_quantization="int4"))
    # the served target's states are other data: captured afresh, never the full-precision cache
    assert not served.data["reused"] and served.data["cache"] != full.data["cache"]
    assert served.data["sha256"] != full.data["sha256"]
    doc = served.to_dict()
    jsonschema.validate(json.loads(json.dumps(doc)), SCHEMA)
    assert doc["options"]["target_quantization"] == "int4" and full.to_dict()["options"]["target_quantization"] is None
    assert doc["target_quantization"]["scheme"] == "int4" and "target_quantization" not in full.to_dict()


def test_a_gain_over_too_few_held_out_prompts_is_not_resolved_and_says_how_to_give_more():
    from eaglekit.finetune.evaluate import Evaluation, Gain

    big = Gain(1.0, 3.5, 2.5, None, "too few prompts", prompts=6, conditions=1)
    evaluation = Evaluation([], big)
    assert not evaluation.gained  # even a large difference: no interval, so no resolved gain
    assert big.to_dict()["too_few_samples"] is True and big.to_dict()["samples"] == 6
    assert evaluation.describe() == (
        "held-out τ 1.000 → 3.500, paired +2.500 over 6 prompts × 1 conditions: the evaluation had too few prompts "
        "to resolve a gain (6, an interval needs 10); give --eval-limit 10 or more (an --eval-prompts file needs at "
        "least 10 prompts)")
