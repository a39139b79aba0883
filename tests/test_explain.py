"""`eaglekit explain`: every rule code and pitfall id printed anywhere resolves to a meaning."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from eaglekit.explain import pitfalls
from eaglekit.rules import all_rules
from tests.support.cli import run_cli


def test_every_rule_and_every_pitfall_a_rule_names_is_explained():
    for rule in all_rules():
        doc = json.loads(run_cli(["explain", rule.code, "--format", "json"]).stdout)
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
