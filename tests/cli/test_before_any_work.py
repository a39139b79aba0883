"""Refusals that come before any work: every written path's folder, and every decode's options against the
target's context. Each command's work is replaced by a failure, so a refusal found after it fails the test."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.support import REPO
from tests.support.cli import run_cli
from tests.support.factory import edit_config, encode, make_draft, make_target_config, write_safetensors

# ------------------------------------------------------------------ every written path, checked before any work


@pytest.fixture
def pair(tmp_path):
    return make_draft(str(tmp_path / "draft"), "vllm"), make_target_config(str(tmp_path / "target"))


def no_work(monkeypatch):
    """Every command's work fails the test if it starts: a refusal must come first."""
    import eaglekit.bench.run
    import eaglekit.capture.cache
    import eaglekit.decode.setup
    import eaglekit.finetune.run
    import eaglekit.verify.run

    def work(*args, **kwargs):
        pytest.fail("the work started before the written paths were checked")

    for module, name in ((eaglekit.decode.setup, "load_target"), (eaglekit.decode.setup, "load_tokenizer"),
                         (eaglekit.bench.run, "start_server"), (eaglekit.bench.run, "BenchClient"),
                         (eaglekit.capture.cache, "capture_store")):
        monkeypatch.setattr(module, name, work)
    for module, name in ((eaglekit.bench.run, "check_engine_available"),
                         (eaglekit.verify.run, "check_engine_available")):  # an engine is there (probing is no work)
        monkeypatch.setattr(module, name, lambda *args, **kwargs: "0.0.0")


WRITES = {
    "verify --save-report": lambda d, t, p: ["verify", d, "--target", t, "--save-report", p],
    "verify --profile-out": lambda d, t, p: ["verify", d, "--target", t, "--profile-out", p],
    "verify --plot": lambda d, t, p: ["verify", d, "--target", t, "--plot", p],
    "compare --save-report": lambda d, t, p: ["compare", d, d, "--target", t, "--save-report", p],
    "bench --save-report": lambda d, t, p: ["bench", d, "--target", t, "--save-report", p],
    "bench --plot": lambda d, t, p: ["bench", d, "--target", t, "--plot", p],
    "finetune --plot": lambda d, t, p: ["finetune", d, os.path.dirname(os.path.dirname(d)) + "/out", "--target", t,
                                        "--plot", p],
    "finetune OUT": lambda d, t, p: ["finetune", d, p, "--target", t],
    "upgrade DST": lambda d, t, p: ["upgrade", d, p, "--target", t],
    "push --card-out": lambda d, t, p: ["push", d, "--repo-id", "org/name", "--dry-run", "--card-out", p],
}


@pytest.mark.parametrize("problem", ["missing", "a file", "read-only"])
@pytest.mark.parametrize("write", sorted(WRITES))
def test_a_written_path_whose_folder_cannot_hold_it_is_refused_before_any_work(tmp_path, pair, monkeypatch, write,
                                                                                problem):
    folder = tmp_path / "reports"
    if problem == "a file":
        folder.write_text("not a folder")
    elif problem == "read-only":  # as root, permission bits do not stop a write: the check asks os.access
        folder.mkdir()
        real_access = os.access
        monkeypatch.setattr(os, "access", lambda p, mode, **kw: os.path.abspath(p) != str(folder)
                            and real_access(p, mode, **kw))
    no_work(monkeypatch)
    path = str(folder / "x.json")
    before = sorted(os.listdir(tmp_path))
    result = run_cli(WRITES[write](*pair, path) + ["--format", "json"])
    want = {"missing": "does not exist", "a file": "is a file, not a folder", "read-only": "is not writable"}[problem]
    assert result.exit_code == (1 if problem == "read-only" else 2), result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"Error: {folder}: the parent") and want in lines[0], lines
    assert sorted(os.listdir(tmp_path)) == before


# ------------------------------------------------------------------ decode options against the target's context


@pytest.mark.parametrize("command", [
    lambda d, t: ["verify", d, "--target", t],
    lambda d, t: ["verify", d, "--target", t, "--engine", "vllm"],
    lambda d, t: ["compare", d, d, "--target", t],
    lambda d, t: ["bench", d, "--target", t, "--max-new-tokens", "64"],
])
def test_a_k_past_the_targets_context_is_one_line_before_any_decode(pair, monkeypatch, command):
    """verify's -k is bounded as compare's is, by one shared check: a huge k is refused, not drafted."""
    draft, target = pair
    edit_config(target, lambda cfg: cfg.update(max_position_embeddings=4096))
    no_work(monkeypatch)
    result = run_cli(command(draft, target) + ["-k", "100000000"])
    assert result.exit_code == 2
    assert result.stderr.strip() == ("Error: --context-tokens 0, 64 new tokens and -k 100,000,000 (the drafts of the "
                                     "last round and its bonus token) leave no room for a prompt in the target's "
                                     "4,096-token context (max_position_embeddings)")


@pytest.mark.parametrize("given, expected", [
    (["--eval-limit", "2"], "Error: --eval-limit 2 held-out prompts: an interval needs 10"),
    (["--eval-prompts", "FEW"], "Error: --eval-prompts FEW has 3 held-out prompts: an interval needs 10"),
])
def test_an_evaluation_too_small_to_resolve_a_gain_is_refused_before_training(pair, tmp_path, monkeypatch, given,
                                                                               expected):
    """Below the interval floor finetune could never write its result: it says so before capturing or training,
    and names both ways out."""
    few = tmp_path / "few.jsonl"
    few.write_text("".join(f'{{"prompt": "write function {i}"}}\n' for i in range(3)))
    given = [str(few) if a == "FEW" else a for a in given]
    draft, target = pair
    no_work(monkeypatch)
    result = run_cli(["finetune", draft, str(tmp_path / "out"), "--target", target, *given])
    assert result.exit_code == 2, result.output
    line = result.stderr.strip().replace(str(few), "FEW")
    assert line.startswith(expected) and line.endswith(
        "give --eval-limit 10 or more, or --keep-unresolved to write the result without a resolved gain"), line
    assert not os.path.exists(tmp_path / "out")


def test_keep_unresolved_takes_an_evaluation_below_the_interval_floor(pair, tmp_path, monkeypatch):
    """With --keep-unresolved the figures are wanted without an interval: the run goes on to its target."""
    draft, target = pair
    no_work(monkeypatch)
    result = run_cli(["finetune", draft, str(tmp_path / "out"), "--target", target, "--eval-limit", "2",
                      "--keep-unresolved"])
    assert result.exit_code == 1 and "cannot load the target model" in result.stderr, result.output


# ------------------------------------------------------------------ options that cannot apply together


IGNORED = {
    "verify --engine reference --tensor-parallel-size": (
        lambda d, t, s: ["verify", d, "--target", t, "--tensor-parallel-size", "2"],
        "--tensor-parallel-size with --engine reference"),
    "compare --engine reference --engine-arg": (
        lambda d, t, s: ["compare", d, d, "--target", t, "--engine-arg", "max_model_len=4096"],
        "--engine-arg with --engine reference"),
    "verify --engine vllm --diagnose": (
        lambda d, t, s: ["verify", d, "--target", t, "--engine", "vllm", "--diagnose"],
        "--diagnose with --engine vllm"),
    "verify --engine vllm --min-acceptance": (
        lambda d, t, s: ["verify", d, "--target", t, "--engine", "vllm", "--min-acceptance", "2"],
        "--min-acceptance with --engine vllm"),
    "verify --engine vllm --aux-layer-ids": (
        lambda d, t, s: ["verify", d, "--target", t, "--engine", "vllm", "--aux-layer-ids", "1,2,3"],
        "--aux-layer-ids with --engine vllm"),
    "compare --engine vllm --turns all": (
        lambda d, t, s: ["compare", d, d, "--target", t, "--engine", "vllm", "--turns", "all"],
        "--turns all with --engine vllm"),
    "finetune --no-eval --eval-limit": (
        lambda d, t, s: ["finetune", d, s, "--target", t, "--no-eval", "--eval-limit", "20"],
        "--eval-limit with --no-eval"),
    "finetune --no-eval -k": (
        lambda d, t, s: ["finetune", d, s, "--target", t, "--no-eval", "-k", "5"], "-k with --no-eval"),
    "finetune --no-eval --tensor-parallel-size": (
        lambda d, t, s: ["finetune", d, s, "--target", t, "--no-eval", "--tensor-parallel-size", "2"],
        "--tensor-parallel-size with --no-eval"),
    "finetune --eval-engine reference --engine-python": (
        lambda d, t, s: ["finetune", d, s, "--target", t, "--eval-engine", "reference", "--engine-python",
                         "/usr/bin/python3"],
        "--engine-python with --eval-engine reference"),
    "finetune --max-resident-shards without --store": (
        lambda d, t, s: ["finetune", d, s, "--target", t, "--max-resident-shards", "4"],
        "--max-resident-shards without --store"),
    "capture --engine vllm --device": (
        lambda d, t, s: ["capture", t, s, "--engine", "vllm", "--device", "cuda"], "--device with --engine vllm"),
    "capture --calibration-tokens without --calibration": (
        lambda d, t, s: ["capture", t, s, "--calibration-tokens", "512"],
        "--calibration-tokens without --calibration"),
    "bench --speed-bench-dataset-subset without --dataset-name": (
        lambda d, t, s: ["bench", d, "--target", t, "--speed-bench-dataset-subset", "throughput_1k"],
        "--speed-bench-dataset-subset chooses a part of --dataset-name"),
    # vLLM run alone reads the files itself, on its own devices: what mirrors or places the reference decode
    "verify --engine vllm --engine-version": (
        lambda d, t, s: ["verify", d, "--target", t, "--engine", "vllm", "--engine-version", "0.33.0"],
        "--engine-version with --engine vllm"),
    "verify --engine vllm --vllm-runner": (
        lambda d, t, s: ["verify", d, "--target", t, "--engine", "vllm", "--vllm-runner", "v1"],
        "--vllm-runner with --engine vllm"),
    "verify --engine vllm --device": (
        lambda d, t, s: ["verify", d, "--target", t, "--engine", "vllm", "--device", "cpu"],
        "--device cpu with --engine vllm"),
    "compare --engine vllm --device": (
        lambda d, t, s: ["compare", d, d, "--target", t, "--engine", "vllm", "--device", "cpu"],
        "--device cpu with --engine vllm"),
    # --vllm-runner picks the reading decoded in the served section, which these skip
    "verify --as-eaglekit-reads --vllm-runner": (
        lambda d, t, s: ["verify", d, "--target", t, "--as-eaglekit-reads", "--vllm-runner", "v2"],
        "--vllm-runner with --as-eaglekit-reads"),
    "verify --aux-layer-ids --vllm-runner": (
        lambda d, t, s: ["verify", d, "--target", t, "--aux-layer-ids", "2,6,9", "--vllm-runner", "v2"],
        "--vllm-runner with --aux-layer-ids"),
    "verify a sweep --vllm-runner": (
        lambda d, t, s: ["verify", d, "--target", t, "--context-tokens", "0,16", "--vllm-runner", "v2"],
        "--vllm-runner with several --context-tokens or --template values"),
    # a misspelt device, found by the options' check, not when the target loads
    "verify --device misspelt": (lambda d, t, s: ["verify", d, "--target", t, "--device", "gpu"],
                                 "--device 'gpu': unknown device"),
    "capture --device misspelt": (lambda d, t, s: ["capture", t, s, "--device", "gpu"], "--device 'gpu': unknown"),
    "finetune --device misspelt": (lambda d, t, s: ["finetune", d, s, "--target", t, "--device", "gpu"],
                                   "--device 'gpu': unknown device"),
    "upgrade --device misspelt": (lambda d, t, s: ["upgrade", d, s, "--target", t, "--device", "gpu"],
                                  "--device 'gpu': unknown device"),
    # an import runs no target: its states are computed already, in their own dtype
    "capture --import --device": (
        lambda d, t, s: ["capture", t, s, "--import", d, "--captured-ids", "2,6,9,12", "--device", "cpu"],
        "--device with --import"),
    "capture --import --dtype": (
        lambda d, t, s: ["capture", t, s, "--import", d, "--captured-ids", "2,6,9,12", "--dtype", "float32"],
        "--dtype with --import"),
    "capture --import --target-quantization": (
        lambda d, t, s: ["capture", t, s, "--import", d, "--captured-ids", "2,6,9,12", "--target-quantization",
                         "fp8"], "--target-quantization with --import"),
    # states read from elsewhere are not captured (no cache), and --import neither runs nor evaluates the target
    "finetune --store --cache-dir": (
        lambda d, t, s: ["finetune", d, s, "--target", t, "--store", d, "--cache-dir", s + "-cache"],
        "--cache-dir with --store"),
    "finetune --import --cache-dir": (
        lambda d, t, s: ["finetune", d, s, "--target", t, "--import", d, "--cache-dir", s + "-cache"],
        "--cache-dir with --import"),
    "finetune --import --dtype": (
        lambda d, t, s: ["finetune", d, s, "--target", t, "--import", d, "--dtype", "bfloat16"],
        "--dtype with --import"),
    "finetune --import --target-dtype (its alias)": (
        lambda d, t, s: ["finetune", d, s, "--target", t, "--import", d, "--target-dtype", "bfloat16"],
        "--dtype with --import"),
    "finetune --import --target-quantization": (
        lambda d, t, s: ["finetune", d, s, "--target", t, "--import", d, "--target-quantization", "fp8"],
        "--target-quantization fp8 with --import"),
    "finetune --import --eval-limit": (
        lambda d, t, s: ["finetune", d, s, "--target", t, "--import", d, "--eval-limit", "20"],
        "--eval-limit with --import"),
    "finetune --import --tensor-parallel-size": (
        lambda d, t, s: ["finetune", d, s, "--target", t, "--import", d, "--tensor-parallel-size", "2"],
        "--tensor-parallel-size with --import"),
    "finetune --store --no-eval --dtype": (
        lambda d, t, s: ["finetune", d, s, "--target", t, "--store", d, "--no-eval", "--dtype", "bfloat16"],
        "--dtype with --no-eval"),
    "finetune --from-scratch --warm-start": (
        lambda d, t, s: ["finetune", d, s, "--target", t, "--from-scratch", "--warm-start", "none"],
        "--warm-start none with --from-scratch"),
    # upgrade: what only a folder output, a Hub source or a calibration can use
    "upgrade --to gguf --max-shard-size": (
        lambda d, t, s: ["upgrade", d, s + ".gguf", "--to", "gguf", "--max-shard-size", "1GB"],
        "--max-shard-size with --to gguf"),
    "upgrade --revision of a local folder": (
        lambda d, t, s: ["upgrade", d, s, "--revision", "main"], "--revision 'main' names a Hub revision"),
    "upgrade --device without --target": (
        lambda d, t, s: ["upgrade", d, s, "--device", "cpu"],
        "--device: it sets up calibration, and this upgrade calibrates nothing (no --target)"),
    "upgrade --calibration-file without target weights": (
        lambda d, t, s: ["upgrade", d, s, "--target", t, "--calibration-file", os.path.join(d, "config.json")],
        "--calibration-file: it sets up calibration, and this upgrade calibrates nothing (the --target given has "
        "no weights"),
    # bench: the key of a running server
    "bench --api-key without --base-url": (
        lambda d, t, s: ["bench", d, "--target", t, "--api-key", "sk-not-shown"], "--api-key without --base-url"),
}


@pytest.mark.parametrize("case", sorted(IGNORED))
def test_an_option_that_cannot_apply_is_refused_before_any_work(pair, tmp_path, monkeypatch, case):
    """An option the run would silently ignore (another engine's, a skipped evaluation's, a missing store's) is a
    usage error in one line naming both options, before any load, capture, training or engine start."""
    command, expected = IGNORED[case]
    refused_before_any_work(monkeypatch, command(*pair, str(tmp_path / "out")), expected)
    assert not os.path.exists(tmp_path / "out")


def refused_before_any_work(monkeypatch, args: list[str], expected: str) -> None:
    """`eaglekit ARGS` exits 2 with one line holding `expected`, every command's work replaced by a failure."""
    import eaglekit.capture.run
    import eaglekit.finetune.run
    import eaglekit.upgrade.run

    no_work(monkeypatch)
    for module, name in ((eaglekit.capture.run, "capture_store"), (eaglekit.finetune.run, "finetune"),
                         (eaglekit.upgrade.run, "_calibrate")):
        monkeypatch.setattr(module, name, lambda *a, **k: pytest.fail("the work started before the refusal"))
    result = run_cli(args)
    assert result.exit_code == 2, result.output
    lines = [line for line in result.stderr.strip().splitlines() if not line.startswith("warning: ")]  # an alias's
    assert len(lines) == 1 and lines[0].startswith("Error: ") and expected in lines[0], lines
    assert "sk-not-shown" not in result.output


@pytest.fixture
def upgrade_sources(tmp_path):
    """Drafts whose config decides what an upgrade option can do, and a target folder with only the head a store's
    reader needs (enough for a calibration from a store)."""
    import numpy as np

    head = make_target_config(str(tmp_path / "head-only"))
    write_safetensors(os.path.join(head, "model.safetensors"), {
        "model.embed_tokens.weight": ("F32", (256, 64), encode(np.zeros((256, 64), np.float32), "F32")),
        "model.norm.weight": ("F32", (64,), encode(np.ones(64, np.float32), "F32"))})
    return {"draft": make_draft(str(tmp_path / "draft"), "vllm"),
            "trained": make_draft(str(tmp_path / "trained"), "vllm", fc_norm=True, norm_output=True),
            "no ids": make_draft(str(tmp_path / "no-ids"), "vllm", config_patch={
                "eagle_aux_hidden_state_layer_ids": None, "eagle_config": {"use_aux_hidden_state": True}}),
            "target": make_target_config(str(tmp_path / "target")), "head only": head,
            "store": str(tmp_path / "store")}


UPGRADE = {
    "--fc-norm-init with a trained fc_norm": (
        lambda x, s: ["upgrade", x["trained"], s, "--target", x["target"], "--fc-norm-init", "ones"],
        "--fc-norm-init ones with a source trained with fc_norm"),
    "--aux-convention without ids to count": (
        lambda x, s: ["upgrade", x["no ids"], s, "--target", x["target"], "--aux-convention", "output"],
        "--aux-convention output without --aux-layer-ids"),
    "--store without calibration": (
        lambda x, s: ["upgrade", x["draft"], s, "--target", x["head only"], "--store", x["store"], "--no-fc-norm",
                      "--no-norm-output"],
        "--store: it sets up calibration, and this upgrade calibrates nothing (--no-fc-norm; --no-norm-output)"),
    "--store with a source trained with fc_norm and norm_output": (
        lambda x, s: ["upgrade", x["trained"], s, "--target", x["head only"], "--store", x["store"],
                      "--target-quantization", "fp8"],
        "--store: it sets up calibration, and this upgrade calibrates nothing (the source's fc_norm is trained; its "
        "norm_output is trained)"),
    "--target-quantization with a target without weights": (
        lambda x, s: ["upgrade", x["trained"], s, "--target", x["target"], "--target-quantization", "fp8"],
        "--target-quantization: it sets up calibration, and this upgrade calibrates nothing (the --target given has "
        "no weights"),
    "--device with --store": (
        lambda x, s: ["upgrade", x["draft"], s, "--target", x["head only"], "--store", x["store"], "--device", "cpu"],
        "--device with --store"),
}


@pytest.mark.parametrize("case", sorted(UPGRADE))
def test_an_upgrade_option_this_draft_leaves_nothing_to_do_is_refused_before_any_work(upgrade_sources, tmp_path,
                                                                                      monkeypatch, case):
    """What an upgrade option can do depends on the draft's config and the other options (a trained fc_norm is
    kept, no ids recorded, nothing calibrated): decided before the target runs or a store is read."""
    command, expected = UPGRADE[case]
    refused_before_any_work(monkeypatch, command(upgrade_sources, str(tmp_path / "out")), expected)
    assert not os.path.exists(tmp_path / "out")


@pytest.mark.parametrize("train, validation_fraction, plot, expected", [
    ({"select_every": 2}, 0.0, None, "--select-every with --validation-fraction 0"),
    ({"steps": 0}, 0.1, "curves.png", "--plot with --steps 0"),
])
def test_a_training_option_the_run_would_ignore_is_refused_by_the_options_check(pair, train, validation_fraction,
                                                                                plot, expected):
    """Training options (their check needs torch) against the run's: refused by checked_options, which finetune
    calls before it reads anything."""
    from eaglekit.errors import UsageError
    from eaglekit.finetune.options import FinetuneOptions, checked_options
    from eaglekit.finetune.train import TrainOptions

    with pytest.raises(UsageError, match=expected):
        checked_options(FinetuneOptions(target=pair[1], train=TrainOptions(**train), eval=None,
                                        validation_fraction=validation_fraction, plot=plot))


def test_every_refusal_comes_before_torch_is_imported(pair, upgrade_sources, tmp_path):
    """Each refusal above is decided from the command line and the files' configs: none waits for torch."""
    out = str(tmp_path / "out")
    commands = [command(*pair, out) for command, _ in IGNORED.values()]
    commands += [command(upgrade_sources, out) for command, _ in UPGRADE.values()]
    commands.append(["finetune", pair[0], out, "--target", pair[1], "--eval-limit", "2"])  # the sample floor's
    code = ("import json, sys\nfrom eaglekit.cli.main import main\ncodes = []\n"
            f"for args in {commands!r}:\n"
            "    try:\n        main(args)\n    except SystemExit as exc:\n        codes.append(exc.code)\n"
            "print(json.dumps({'codes': codes, 'torch': 'torch' in sys.modules}))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=False,
                          cwd=str(REPO), env={**os.environ, "PYTHONPATH": str(REPO)})
    assert proc.returncode == 0, proc.stderr[-2000:]
    done = json.loads(proc.stdout.strip().splitlines()[-1])
    assert done["codes"] == [2] * len(commands), list(zip(done["codes"], commands))
    assert not done["torch"]
