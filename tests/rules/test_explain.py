"""`eaglekit explain`: every rule code and pitfall id printed anywhere resolves to a meaning."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys

import jsonschema
import pytest

from eaglekit.explain import pitfalls
from eaglekit.rules import all_rules
from tests.support import REPO
from tests.support.cli import run_cli
from tests.support.factory import make_draft

SCHEMA = json.load(open(os.path.join(str(REPO), "schemas", "explain-report.schema.json")))


def test_every_rule_and_every_pitfall_a_rule_names_is_explained():
    for rule in all_rules():
        doc = json.loads(run_cli(["explain", rule.code, "--format", "json"]).stdout)
        jsonschema.validate(doc, SCHEMA)
        assert doc["title"] == rule.title and doc["facts"]["severity"] == rule.severity
        if rule.pitfall:
            assert rule.pitfall in pitfalls(), rule.code
            assert doc["related"][0]["title"] == pitfalls()[rule.pitfall]["title"]


def test_a_pitfall_lists_the_rules_that_guard_it():
    doc = json.loads(run_cli(["explain", "p17", "--format", "json"]).stdout)
    assert doc["kind"] == "pitfall" and doc["facts"]["shows_up"]
    assert "EK307" in {r["code"] for r in doc["related"]}
    human = run_cli(["explain", "EK307"]).stdout
    assert "aux ids only in eagle_config" in human and "P17" in human


@pytest.mark.parametrize("code", ["EK999", "P999", "hello"])
def test_unknown_codes_are_a_usage_error(code):
    result = run_cli(["explain", code])
    assert result.exit_code == 2 and len(result.stderr.strip().splitlines()) == 1


def test_explain_stays_torch_free():
    code = ("import sys; from eaglekit.cli.main import main; sys.argv = ['eaglekit', 'explain', 'EK101']\n"
            "try: main()\nexcept SystemExit: pass\nassert 'torch' not in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True, capture_output=True)


def test_every_rule_says_how_to_fix_what_it_finds_in_text_and_json():
    for rule in all_rules():
        doc = json.loads(run_cli(["explain", rule.code, "--format", "json"]).stdout)
        assert isinstance(doc["fix"], str) and doc["fix"].strip(), rule.code
        assert f"fix: {doc['fix']}" in run_cli(["explain", rule.code]).stdout.splitlines(), rule.code


def test_a_pitfall_gives_the_fix_of_each_rule_that_guards_it():
    doc = json.loads(run_cli(["explain", "P17", "--format", "json"]).stdout)
    jsonschema.validate(doc, SCHEMA)
    assert doc["fix"] is None and all(r["fix"] for r in doc["related"])
    ek307 = next(r for r in doc["related"] if r["code"] == "EK307")
    assert f"  fix: {ek307['fix']}" in run_cli(["explain", "P17"]).stdout.splitlines()


@pytest.mark.parametrize("code, command", [
    ("EK307", "eaglekit upgrade DRAFT DRAFT-vllm"),  # vLLM: upgrade's default output
    ("EK351", "eaglekit upgrade DRAFT DRAFT-sglang --to sglang"),
    ("EK363", "eaglekit upgrade DRAFT DRAFT-trtllm --to trtllm"),
    ("EK375", "eaglekit upgrade DRAFT DRAFT.gguf --target TARGET.gguf --to gguf"),  # a GGUF needs the target's
])
def test_an_engine_rule_the_upgrade_rewrites_is_fixed_by_the_upgrade_for_that_engine(code, command):
    fix = json.loads(run_cli(["explain", code, "--format", "json"]).stdout)["fix"]
    assert fix.startswith(f"`{command}` writes what ")


@pytest.mark.parametrize("code, engine", [("EK314", "vLLM"), ("EK352", "SGLang"), ("EK366", "TensorRT-LLM"),
                                          ("EK371", "llama.cpp"), ("EK385", "tokenspeed")])
def test_a_function_the_engine_lacks_is_no_rewrite_away(code, engine):
    fix = json.loads(run_cli(["explain", code, "--format", "json"]).stdout)["fix"]
    assert fix.startswith(f"no rewrite of the files serves it on {engine}: serve it with ") \
        or fix.startswith(f"no rewrite of the files serves it on {engine}: retrain ")
    assert "eaglekit upgrade" not in fix


@pytest.mark.parametrize("code", ["EK311", "EK324", "EK325", "EK326", "EK328"])
def test_an_error_the_upgrade_cannot_fix_has_a_fix_of_its_own(code):
    fix = json.loads(run_cli(["explain", code, "--format", "json"]).stdout)["fix"]
    assert "eaglekit upgrade" not in fix and fix.startswith(("serve it with", "write the"))


def test_validate_offers_no_upgrade_where_the_upgrade_refuses_to_write_for_the_engine(tmp_path):
    draft = make_draft(str(tmp_path / "nbr"), "specforge", config_patch={"norm_before_residual": True})
    doc = json.loads(run_cli(["validate", draft, "--engine", "sglang", "--format", "json"]).stdout)
    assert "EK352" in {f["code"] for f in doc["findings"] if f["severity"] == "error"} and doc["fix"] is None
    refused = run_cli(["upgrade", draft, str(tmp_path / "out"), "--to", "sglang", "--no-fc-norm", "--no-norm-output"])
    assert refused.exit_code != 0 and "norm_before_residual" in refused.stderr  # what an offered upgrade would meet


def test_validate_offers_no_upgrade_for_a_release_too_old(tmp_path):
    mla = make_draft(str(tmp_path / "mla"), "vllm", attention="mla", fc_norm=True)
    doc = json.loads(run_cli(["validate", mla, "--engine-version", "0.22", "--format", "json"]).stdout)
    assert [f["code"] for f in doc["findings"] if f["severity"] == "error"] == ["EK311"]
    assert doc["fix"] is None  # the upgrade keeps the trained fc_norm: 0.22 would still lack it


def test_the_upgrade_explain_names_serves_the_draft_on_that_engine(tmp_path, monkeypatch):
    draft = make_draft(str(tmp_path / "ready"), "vllm", fc_norm=True, norm_output=True)
    failing = json.loads(run_cli(["validate", draft, "--engine", "sglang", "--format", "json"]).stdout)
    assert "EK351" in {f["code"] for f in failing["findings"]} and not failing["ok"]
    fix = json.loads(run_cli(["explain", "EK351", "--format", "json"]).stdout)["fix"]
    command = shlex.split(fix.split("`")[1].replace("DRAFT", draft))
    monkeypatch.chdir(tmp_path)
    assert run_cli(command[1:]).exit_code == 0
    fixed = json.loads(run_cli(["validate", command[3], "--engine", "sglang", "--format", "json"]).stdout)
    assert fixed["ok"], fixed["findings"]
