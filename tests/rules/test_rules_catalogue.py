"""Every rule, on real bytes: a checkpoint with the defect makes it fire; its healthy twin passes clean.

Each case (tests/support/rule_cases.py) writes a tiny draft with `tests.support.factory`, breaks one thing, and
runs only the rule's own group (plus its engine), so the twin must come out with no error and no warning from that
group.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from eaglekit.families import load_draft
from eaglekit.rules import run_rules
from eaglekit.rules.target import DECODE_CODES
from eaglekit.target import read_target
from tests.support.rule_cases import CASES, RULES, Case

# covered by dedicated tests: test_rules_deep_scan.py (need a file truncated after loading, or an F4 tensor),
# test_rules_readback.py (upgrade's read-back rules judge an output against its plan) and test_rules_decode.py (the
# decode rules judge a draft against the decode that runs it)
DEDICATED = {"EK414", "EK415", "EK191", "EK192", "EK193", "EK194", "EK195", *DECODE_CODES}


def _run(case: Case, builder, where: Path):
    where.mkdir(parents=True, exist_ok=True)
    built = builder(where)
    path, target_path = built if isinstance(built, tuple) else (built, None)
    tgt = read_target(target_path) if target_path else None
    spec = load_draft(path, target=tgt)
    rule = RULES[case.code]
    return run_rules(spec, target=tgt, engine=rule.engine or "vllm", engine_version=case.version,
                     groups=(rule.group,), deep=rule.group == "deep")


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_rule_fires_on_the_broken_checkpoint(case, tmp_path):
    report = _run(case, case.broken, tmp_path)
    fired = [f for f in report.findings if f.code == case.code]
    assert fired, f"{case.code} did not fire; got {[(f.code, f.message) for f in report.findings]}"
    for f in fired:
        assert f.severity == RULES[case.code].severity and f.pitfall == RULES[case.code].pitfall
        assert "\n" not in f.message and len(f.message) > 20


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_healthy_twin_passes_clean(case, tmp_path):
    report = _run(case, case.healthy, tmp_path)
    loud = [(f.code, f.message) for f in report.findings if f.severity != "info" or f.code == case.code]
    assert not loud


def test_every_rule_has_a_firing_case():
    assert {c.code for c in CASES} | DEDICATED == set(RULES)
