"""`eaglekit upgrade` through the console entry point: output formats, exit codes, no torch, and a killed run."""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import time

import jsonschema
import numpy as np
import pytest

from eaglekit.cli.upgrade import parse_size
from eaglekit.errors import UsageError
from eaglekit.families import load_draft
from eaglekit.io.tensors import read_array, read_bytes
from eaglekit.redact import public_path
from eaglekit.rules import run_rules
from tests.support import REPO
from tests.support.cli import run_cli as run
from tests.support.factory import make_draft, make_target_config


def load_json(path) -> dict:
    with open(path, encoding="utf-8") as fh:
        return json.load(fh)


ROOT = str(REPO)
REPORT = load_json(os.path.join(ROOT, "schemas", "upgrade-report.schema.json"))


@pytest.fixture(scope="module")
def drafts(tmp_path_factory):
    base = tmp_path_factory.mktemp("drafts")
    return {
        "modelopt": make_draft(str(base / "modelopt"), "modelopt", frequency_ordered=True),
        "sglang": make_draft(str(base / "sglang"), "sglang"),
        "target": make_target_config(str(base / "target")),
    }


@pytest.mark.parametrize("extra", [[], ["--fc-norm"], ["--fc-norm", "--dry-run"], ["--no-fc-norm", "--no-norm-output"],
                                   ["--fc-norm", "--to", "speculators"]])
def test_json_report_validates_against_the_schema(drafts, tmp_path, extra):
    result = run(["upgrade", "--from", "eagle3", drafts["modelopt"], str(tmp_path / "out"),
                  "--target", drafts["target"], "--format", "json", *extra])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    jsonschema.validate(doc, REPORT)
    assert doc["dry_run"] == ("--dry-run" in extra)
    assert doc["validated"] == ("--dry-run" not in extra)
    assert os.path.isdir(tmp_path / "out") != doc["dry_run"]
    untrained_vllm = "--fc-norm" in extra and "--to" not in extra  # the target given has no weights
    # the JSON names folders by their names only (no local path leaves in a report); the human output shows all
    assert doc["next_command"] == (None if not untrained_vllm else
                                   f"eaglekit finetune out out-tuned --target {public_path(drafts['target'])}")


def test_human_report_says_plainly_what_happened(drafts, tmp_path):
    result = run(["upgrade", drafts["modelopt"], str(tmp_path / "out"), "--target", drafts["target"], "--fc-norm"])
    assert result.exit_code == 0, result.output
    text = result.stdout
    assert "warm start: needs fine-tuning" in text
    assert "norm_output switched on" in text
    assert "validated for vLLM" in text
    assert f"next: eaglekit finetune {tmp_path / 'out'}" in text
    validated = run(["validate", str(tmp_path / "out")])
    assert "EK156" in validated.stdout and "eaglekit finetune" in validated.stdout
    again = run(["upgrade", str(tmp_path / "out"), str(tmp_path / "again"), "--format", "json"])
    assert json.loads(again.stdout)["findings"] and "EK156" in {f["code"] for f in json.loads(again.stdout)["findings"]}
    lossless = run(["upgrade", drafts["modelopt"], str(tmp_path / "lossless"), "--no-fc-norm", "--no-norm-output"])
    assert "function-preserving" in lossless.stdout


def test_dry_run_prints_every_tensor(drafts, tmp_path):
    result = run(["upgrade", drafts["modelopt"], str(tmp_path / "out"), "--target", drafts["target"], "--fc-norm",
                  "--dry-run"])
    assert result.exit_code == 0, result.output
    assert "Dry run: nothing was written." in result.stdout
    for action in ("copy", "transform", "add"):
        assert action in result.stdout
    assert "fc_norm.2.weight" in result.stdout and "layers.0.self_attn.q_proj.weight" in result.stdout
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("with_target", [False, True])
def test_without_the_targets_weights_the_default_keeps_eagle3(drafts, tmp_path, with_target):
    """Nothing can keep the EAGLE-3 function with the 3.1 flags on: the output is a lossless EAGLE-3 conversion,
    and the report says why and how to get 3.1."""
    target = ["--target", drafts["target"]] if with_target else []  # a config.json without weights
    src = make_draft(str(tmp_path / "src"), "vllm")
    result = run(["upgrade", src, str(tmp_path / "out"), *target, "--format", "json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    jsonschema.validate(doc, REPORT)
    assert doc["function"] == "preserved" and doc["output"]["eagle_version"] == "3"
    assert not doc["flags"]["fc_norm"] and not doc["flags"]["norm_output"] and doc["flags"]["fc_norm_init"] is None
    assert doc["next_command"] is None
    note = [w for w in doc["warnings"] if w.startswith("kept EAGLE-3 (fc_norm, norm_output off)")]
    assert len(note) == 1 and "target's weights" in note[0] and "--fc-norm-init ones" in note[0]
    cfg = load_json(tmp_path / "out" / "config.json")
    assert cfg["eaglekit"]["options"]["fc_norm"] is False and cfg["eaglekit"]["options"]["norm_output"] is False
    out = load_draft(str(tmp_path / "out"))
    assert out.eagle_version == "3" and not out.facts.fc_norm_tensor_ids

    lossless = run(["upgrade", src, str(tmp_path / "lossless"), *target, "--no-fc-norm",
                    "--no-norm-output", "--format", "json"])
    assert lossless.exit_code == 0, lossless.output
    asked = json.loads(lossless.stdout)
    assert not any(w.startswith("kept EAGLE-3") for w in asked["warnings"])  # asked for: nothing to say
    # the same plan as the lossless conversion asked for outright: every tensor copied, byte for byte
    assert doc["tensors"] == asked["tensors"] and {s["action"] for s in doc["tensors"]} == {"copy"}
    assert tensor_bytes(tmp_path / "out") == tensor_bytes(src) == tensor_bytes(tmp_path / "lossless")
    assert {k: v for k, v in doc["config"].items() if k != "eaglekit"} == \
        {k: v for k, v in asked["config"].items() if k != "eaglekit"}

    human = run(["upgrade", src, str(tmp_path / "human"), *target])
    assert human.exit_code == 0, human.output
    text = " ".join(human.stdout.split())
    assert "warning: kept EAGLE-3 (fc_norm, norm_output off)" in text and "--fc-norm-init ones" in text
    assert "function-preserving" in text and "next:" not in text


def tensor_bytes(path) -> dict[str, bytes]:
    spec = load_draft(str(path))
    return {ref.source_name: read_bytes(spec.path, ref) for ref in spec.tensors.values()}


def test_fc_norm_init_ones_without_a_target_writes_the_warm_start(drafts, tmp_path):
    result = run(["upgrade", drafts["modelopt"], str(tmp_path / "out"), "--fc-norm-init", "ones", "--format", "json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["function"] == "warm-start" and doc["output"]["eagle_version"] == "3.1"
    assert doc["flags"]["fc_norm_added"] and doc["flags"]["fc_norm_init"] == "ones"
    assert doc["flags"]["norm_output_added"]
    assert not any(w.startswith("kept EAGLE-3") for w in doc["warnings"])
    assert doc["next_command"] is None  # no target to name: next_step says what to run in words
    assert doc["next_step"].startswith("fine-tune out against its target with `eaglekit finetune`")
    out = load_draft(str(tmp_path / "out"))
    assert out.eagle_version == "3.1"
    for k in range(3):  # unit weights: nothing to calibrate on
        assert np.all(read_array(out, f"fc_norm.{k}.weight", as_float32=True) == 1.0)
    for flag in (["--fc-norm"], ["--norm-output"]):  # either flag asked for alone writes the same start
        alone = run(["upgrade", drafts["modelopt"], str(tmp_path / flag[0][2:]), *flag, "--format", "json"])
        assert alone.exit_code == 0, alone.output
        assert json.loads(alone.stdout)["flags"] == doc["flags"]


@pytest.mark.parametrize("ids", ["1,5,8", "1 5 8", "1, 5, 8"])
def test_ids_and_convention_on_the_command_line(drafts, tmp_path, ids):
    result = run(["upgrade", drafts["sglang"], str(tmp_path / "out"), "--aux-layer-ids", ids,
                  "--aux-convention", "output", "--format", "json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["aux"]["ids"] == [2, 6, 9]


@pytest.mark.parametrize("args,code,message", [
    (["--aux-layer-ids", "2,x,9"], 2, "--aux-layer-ids"),
    (["--aux-layer-ids", "-1,5,9"], 2, "non-negative"),
    (["--aux-layer-ids", ","], 2, "--aux-layer-ids"),
    (["--max-shard-size", "lots"], 2, "--max-shard-size"),
    (["--fc-norm-init", "calibrated"], 2, "needs --target"),
    (["--to", "speculators", "--from", "nonsense"], 2, "--from"),
    ([], 2, "not recorded"),  # F2 without ids, no target
])
def test_usage_errors_exit_2_with_one_line(drafts, tmp_path, args, code, message):
    result = run(["upgrade", drafts["sglang"], str(tmp_path / "out"), *args])
    assert result.exit_code == code, result.output
    assert message in result.stderr and "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "out").exists()


def test_existing_output_exits_2_and_is_untouched(drafts, tmp_path):
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "x").write_text("keep")
    result = run(["upgrade", drafts["modelopt"], str(tmp_path / "out")])
    assert result.exit_code == 2 and "--force" in result.stderr
    assert os.listdir(tmp_path / "out") == ["x"]


def test_bad_checkpoints_exit_1(tmp_path):
    missing = run(["upgrade", str(tmp_path / "nope"), str(tmp_path / "out")])
    assert missing.exit_code == 1 and "no such file" in missing.stderr
    src = make_draft(str(tmp_path / "src"), "vllm", drop=("d2t",))
    broken = run(["upgrade", src, str(tmp_path / "out")])
    assert broken.exit_code == 1 and "d2t" in broken.stderr
    assert not (tmp_path / "out").exists()


def test_parse_size():
    assert parse_size("5GB") == 5 * 10**9 and parse_size("2GiB") == 2 * 2**30 and parse_size("1234") == 1234
    assert parse_size("1.5 MB") == 1_500_000
    with pytest.raises(UsageError):
        parse_size("5 parsecs")


def _python(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120,
                          check=False)


def test_help_and_a_plain_upgrade_never_import_torch(drafts, tmp_path):
    code = f"""
import sys
from eaglekit.cli.main import main
for args in (["upgrade", "--help"], ["upgrade", {drafts['modelopt']!r}, {str(tmp_path / 'out')!r}, "--format", "json"],
             ["upgrade", {drafts['modelopt']!r}, {str(tmp_path / 'warm')!r}, "--fc-norm-init", "ones"]):
    try:
        main(args)
    except SystemExit as exc:
        assert not exc.code, exc.code
print("TORCH", "torch" in sys.modules, "transformers" in sys.modules)
"""
    proc = _python(code)
    assert proc.returncode == 0, proc.stderr
    assert "TORCH False False" in proc.stdout
    assert "--fc-norm-init" in proc.stdout


# ---------------------------------------------------------------- killed mid-write


@pytest.fixture(scope="module")
def big_draft(tmp_path_factory):
    """~70 MB of bf16 weights: slow enough to write (cast to fp32) that a kill lands mid-file."""
    return make_draft(str(tmp_path_factory.mktemp("big") / "src"), "vllm", hidden=1024, heads=8, kv_heads=2,
                      head_dim=128, intermediate=4096, vocab=32768, draft_vocab=16384)


def _start(src: str, dst: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "eaglekit.cli", "upgrade", src, dst, "--dtype", "fp32",
                             "--no-fc-norm", "--no-norm-output", "--format", "json"],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def _wait_for_partial_weights(parent: str, proc: subprocess.Popen, deadline_s: float = 60.0) -> str:
    end = time.monotonic() + deadline_s
    while time.monotonic() < end and proc.poll() is None:
        for name in os.listdir(parent):
            if ".eaglekit-partial-" in name:
                weights = os.path.join(parent, name, "model.safetensors")
                if os.path.exists(weights) and os.path.getsize(weights) > 0:
                    return weights
        time.sleep(0.001)
    raise AssertionError(f"the run never reached the copy (exit {proc.poll()})")


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM])
def test_a_run_killed_mid_write_leaves_no_output(big_draft, tmp_path, sig):
    parent = tmp_path / "work"
    parent.mkdir()
    dst = str(parent / "out")
    before = os.stat(os.path.join(big_draft, "model.safetensors"))
    proc = _start(big_draft, dst)
    weights = _wait_for_partial_weights(str(parent), proc)
    proc.send_signal(sig)
    proc.wait(timeout=60)
    assert not os.path.exists(dst)  # never half-written
    if sig == signal.SIGTERM:
        assert proc.returncode == 128 + signal.SIGTERM
        assert os.listdir(parent) == []  # the handler removed the staging directory
    else:
        assert os.path.exists(weights)  # a hard kill leaves only the hidden staging folder
    after = os.stat(os.path.join(big_draft, "model.safetensors"))
    assert (after.st_size, after.st_mtime_ns) == (before.st_size, before.st_mtime_ns)

    # the next run completes, validates, and removes the dead run's leftovers
    proc = _start(big_draft, dst)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err.decode()
    assert os.listdir(parent) == ["out"]
    spec = load_draft(dst)
    assert spec.dtype == "F32" and run_rules(spec).errors == 0


@pytest.mark.parametrize("extra", [["--no-fc-norm", "--no-norm-output"], ["--dry-run"], ["--fc-norm"]])
def test_at_80_columns_no_line_is_wider_and_every_path_is_whole(drafts, tmp_path_factory, monkeypatch, extra):
    """A log or a pipe (not a TTY) at COLUMNS=80: the summary, the tensor plan and the commands are lines within
    80 characters (bar an argument wider than a line, alone on its line), and the source, output and target paths
    each appear whole on a line (nothing folded or cut)."""
    from eaglekit.cli.output import out

    monkeypatch.setattr(out, "width", 80)  # first: what is restored is the width before COLUMNS=80
    monkeypatch.setenv("COLUMNS", "80")
    dst = str(tmp_path_factory.mktemp("u") / "draft-for-vllm")  # a path that fits a line of its own
    result = run(["upgrade", drafts["modelopt"], dst, "--target", drafts["target"], *extra])
    assert result.exit_code == 0, result.stderr
    lines = result.stdout.splitlines()
    # the one exception: an argument of a command to paste that is itself wider than a line (the serve line's
    # --speculative-config JSON names the output path) stands whole on a line of its own, never split
    wide = [line for line in lines if len(line) > 80]
    assert all(line.startswith("    ") and len(shlex.split(line.removesuffix(" \\"))) == 1 for line in wide), wide
    for path in (drafts["modelopt"], dst):
        assert any(path in line for line in lines), path
    if "--dry-run" in extra:  # the whole plan, every tensor name whole
        assert all(any(f" {name};" in line for line in lines) for name in ("d2t", "fc.weight", "norm.weight"))
    if "--fc-norm" in extra:  # the command to paste, continued with backslashes: the shell joins it as printed
        start = next(i for i, line in enumerate(lines) if line.startswith("next: "))
        command = "\n".join(lines[start:start + 4]).split("\n  (")[0]
        assert shlex.split(command.replace("\\\n", " "))[1:] == ["eaglekit", "finetune", dst, f"{dst}-tuned",
                                                                   "--target", drafts["target"]]
