"""`eaglekit validate` through the real entry point: exit codes, JSON schema, strictness, bad input, no writes."""

from __future__ import annotations

import hashlib
import json
import os

import jsonschema
import numpy as np
import pytest

from eaglekit.rules import all_rules
from tests.support import REPO
from tests.support.cli import run_cli
from tests.support.factory import make_draft, make_target_config

SCHEMAS = os.path.join(str(REPO), "schemas")


def _schema(name: str) -> dict:
    with open(os.path.join(SCHEMAS, name)) as fh:
        return json.load(fh)


REPORT = _schema("validate-report.schema.json")
RULES = _schema("validate-rules.schema.json")


def run(*args):
    return run_cli(["validate", *args])


@pytest.fixture(scope="module")
def drafts(tmp_path_factory):
    base = tmp_path_factory.mktemp("validate")
    return {
        "ready": make_draft(str(base / "ready"), "vllm", fc_norm=True, norm_output=True),
        "mla": make_draft(str(base / "mla"), "vllm", attention="mla", fc_norm=True),
        "specforge": make_draft(str(base / "specforge"), "specforge"),
        "speculators": make_draft(str(base / "speculators"), "speculators", norm_before_residual=None),
        "nan": make_draft(str(base / "nan"), "vllm", add={"norm.weight": np.full(64, np.nan, np.float32)}),
        "target": make_target_config(str(base / "target")),
    }


def _json(result) -> dict:
    doc = json.loads(result.stdout)
    jsonschema.validate(doc, REPORT)
    return doc


def test_healthy_draft_exits_0(drafts):
    result = run(drafts["ready"], "--target", drafts["target"], "--deep", "--strict")
    assert result.exit_code == 0, result.output
    assert "PASSED" in result.stdout
    with_target = _json(run(drafts["ready"], "--target", drafts["target"], "--deep", "--format", "json"))
    assert with_target["groups"] == ["structure", "target", "engine", "deep"]
    assert _json(run(drafts["ready"], "--format", "json"))["groups"] == ["structure", "engine"]


def test_errors_exit_1_and_still_print_the_report(drafts):
    result = run(drafts["specforge"], "--format", "json")
    assert result.exit_code == 1
    doc = _json(result)
    assert not doc["ok"] and doc["errors"] == 1
    assert [f["code"] for f in doc["findings"] if f["severity"] == "error"] == ["EK307"]
    human = run(drafts["specforge"])
    assert human.exit_code == 1 and "EK307" in human.stdout and "FAILED" in human.stdout


def test_strict_turns_warnings_into_failure(drafts):
    lenient = run(drafts["speculators"], "--format", "json")
    assert lenient.exit_code == 0 and _json(lenient)["warnings"] >= 1 and _json(lenient)["ok"]
    strict = run(drafts["speculators"], "--format", "json", "--strict")
    assert strict.exit_code == 1
    doc = _json(strict)
    assert not doc["ok"] and doc["strict"] and doc["errors"] == 0
    assert "EK150" in {f["code"] for f in doc["findings"]}


def test_deep_reads_values_only_when_asked(drafts):
    assert run(drafts["nan"]).exit_code == 0
    deep = run(drafts["nan"], "--deep", "--format", "json")
    assert deep.exit_code == 1
    assert [(f["code"], f["tensor"]) for f in _json(deep)["findings"]] == [("EK401", "norm.weight")]


def test_engine_version_selects_the_rules(drafts):
    assert run(drafts["mla"], "--engine-version", "0.23").exit_code == 0
    old = run(drafts["mla"], "--engine-version", "0.22", "--format", "json")
    assert old.exit_code == 1
    doc = _json(old)
    assert doc["engines"] == [{"engine": "vllm", "version": "0.22.0", "errors": 1, "ok": False, "settings": [],
                               "fix": doc["fix"]}]
    assert "EK311" in {f["code"] for f in doc["findings"]}


def test_engine_all_and_sglang(drafts):
    doc = _json(run(drafts["ready"], "--engine", "all", "--format", "json"))
    assert [(e["engine"], e["ok"]) for e in doc["engines"]] == [
        ("vllm", True), ("sglang", False), ("trtllm", True), ("llamacpp", False), ("tokenspeed", True)]
    # SGLang shifts the eagle_config ids; llama.cpp has no EAGLE-3.1; TensorRT-LLM and tokenspeed need their setting
    assert {f["code"] for f in doc["findings"] if f["severity"] != "info"} == {"EK351", "EK361", "EK371", "EK381"}
    by_engine = {e["engine"]: e for e in doc["engines"]}
    assert by_engine["sglang"]["fix"].endswith("-sglang --to sglang") and by_engine["llamacpp"]["fix"] is None
    assert by_engine["trtllm"]["settings"] == ["eagle3_layers_to_capture: [1, 5, 8]"]
    assert by_engine["tokenspeed"]["settings"] == ["--eagle3-layers-to-capture 1,5,8"]
    human = run(drafts["ready"], "--engine", "all").stdout
    assert "vllm 0.33.0: serves it" in human and "sglang 0.5.23: 1 error(s) stop it" in human
    assert "trtllm 1.2.0: serves it with eagle3_layers_to_capture: [1, 5, 8]" in human
    assert run(drafts["specforge"], "--engine", "sglang").exit_code == 0


def test_list_rules(drafts):
    human = run("--list-rules")
    assert human.exit_code == 0 and "EK101" in human.stdout and "EK415" in human.stdout
    doc = json.loads(run("--list-rules", "--format", "json").stdout)
    jsonschema.validate(doc, RULES)
    assert [r["code"] for r in doc["rules"]] == [r.code for r in all_rules()]


@pytest.mark.parametrize("args, code, text", [
    ([], 2, "PATH is required"),
    (["{ready}", "--engine", "all", "--engine-version", "0.30"], 2, "needs a single --engine"),
    (["{ready}", "--engine-version", "zero"], 2, "is not X.Y"),
    (["{ready}", "--engine", "mlc"], 2, "unknown engine 'mlc'"),
    (["{ready}", "--engine", "vllm,mlc"], 2, "unknown engine 'mlc'"),
    (["{missing}"], 1, "no such file or directory"),
    (["{ready}", "--target", "{missing}"], 1, "no such file or directory"),
])
def test_bad_input_is_one_line(drafts, tmp_path, args, code, text):
    args = [a.format(ready=drafts["ready"], missing=str(tmp_path / "nope")) for a in args]
    result = run(*args)
    assert result.exit_code == code
    assert text in result.stderr and "Traceback" not in result.output


def test_truncated_file_is_one_clear_line(tmp_path):
    path = make_draft(str(tmp_path / "d"), "vllm")
    weights = os.path.join(path, "model.safetensors")
    with open(weights, "r+b") as fh:
        fh.truncate(os.path.getsize(weights) - 100)
    result = run(path, "--deep")
    assert result.exit_code == 1
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "model.safetensors" in lines[0] and "truncated" in lines[0]


def test_validate_never_modifies_the_source(drafts):
    def digest(path):
        return {f: hashlib.sha256(open(os.path.join(path, f), "rb").read()).hexdigest()
                for f in sorted(os.listdir(path))}

    before = digest(drafts["nan"])
    run(drafts["nan"], "--deep", "--engine", "all", "--target", drafts["target"])
    assert digest(drafts["nan"]) == before


def test_engine_errors_come_with_the_command_that_fixes_them(tmp_path, monkeypatch):
    import shlex

    source = make_draft(str(tmp_path / "sf"), "specforge")  # EK307: ids only in eagle_config
    fix = f"eaglekit upgrade {source} sf-vllm --no-fc-norm --no-norm-output"  # writes where the user is
    assert fix in run(source).stdout  # printed whole, never wrapped
    doc = _json(run(source, "--format", "json"))  # JSON names local folders by name only
    assert not doc["ok"] and doc["fix"] == "eaglekit upgrade sf sf-vllm --no-fc-norm --no-norm-output"
    command = shlex.split(fix)
    monkeypatch.chdir(tmp_path)
    assert run_cli(command[1:]).exit_code == 0
    fixed = _json(run(f"{source}-vllm", "--format", "json"))
    assert fixed["ok"] and fixed["fix"] is None
    assert _json(run(make_draft(str(tmp_path / "nan"), "vllm", add={"norm.weight": np.full(64, np.nan, np.float32)}),
                     "--deep", "--format", "json"))["fix"] is None  # a deep error is not upgrade's to fix


def test_a_wrong_target_is_named_as_the_users_mistake_with_no_fix(tmp_path):
    draft = make_draft(str(tmp_path / "d"), "specforge")  # built for T=64, V=256, ids up to 9
    other = make_target_config(str(tmp_path / "other"), layers=8, hidden=96, vocab=512)
    doc = _json(run(draft, "--target", other, "--format", "json"))
    assert doc["target_mismatch"].startswith("this draft was built for H=64, V=256, L≥9; the target has 96 / 512 / 8")
    assert doc["fix"] is None and all(e["fix"] is None for e in doc["engines"])  # an upgrade would not help
    assert "is --target the right model?" in run(draft, "--target", other).stdout.splitlines()[2]
    right = make_target_config(str(tmp_path / "right"))
    assert _json(run(draft, "--target", right, "--format", "json"))["target_mismatch"] is None


def test_a_draft_passed_as_the_target_is_recognised(tmp_path):
    draft = make_draft(str(tmp_path / "d"), "vllm")
    result = run(draft, "--target", make_draft(str(tmp_path / "other-draft"), "speculators"))
    assert result.exit_code == 1
    assert "this is an EAGLE draft" in result.stderr and "not a target model" in result.stderr
