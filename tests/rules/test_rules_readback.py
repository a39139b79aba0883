"""Upgrade's read-back rules (EK191..EK195), on real bytes: an upgrade's output is written, then one thing in it is
broken; held to the upgrade's own plan and decisions, exactly the rule for that defect fires, and the intact output
passes clean. They are registered rules: explain knows them, and an ordinary rules run leaves them silent."""

from __future__ import annotations

import pytest

from eaglekit.explain import explain
from eaglekit.families import load_draft
from eaglekit.rules import all_rules, run_rules
from eaglekit.rules.registry import READBACK_CODES
from eaglekit.upgrade.check import readback_findings
from eaglekit.upgrade.decide import decide
from eaglekit.upgrade.dialects import get_dialect
from eaglekit.upgrade.options import UpgradeOptions
from eaglekit.upgrade.plan import build_plan
from eaglekit.upgrade.vocab import plan_vocab
from tests.support.cli import run_cli
from tests.support.factory import edit_config, make_draft, rewrite_tensors


def _drop_fc(tensors):
    tensors.pop("fc.weight")


def _narrow_norm(tensors):
    dtype, shape, raw = tensors["norm.weight"]
    tensors["norm.weight"] = (dtype, (shape[0] // 2,), raw[: len(raw) // 2])


def _ids(config):
    config["eagle_aux_hidden_state_layer_ids"] = [1, 4, 7]


def _k(config):
    config["target_hidden_size"] *= 3  # fc's in-features are then one target state wide: K=1


def _norm_output(config):
    config["norm_output"] = True


BREAKS = {
    "EK191": lambda out: rewrite_tensors(out, _drop_fc),
    "EK192": lambda out: rewrite_tensors(out, _narrow_norm),
    "EK193": lambda out: edit_config(out, _ids),
    "EK194": lambda out: edit_config(out, _k),
    "EK195": lambda out: edit_config(out, _norm_output),
}


@pytest.fixture(scope="module")
def upgraded(tmp_path_factory):
    """A source, its upgrade's plan and decisions (vLLM dialect, EAGLE-3 kept), and a fresh output per call."""
    base = tmp_path_factory.mktemp("readback")
    source = make_draft(str(base / "source"), "specforge")
    spec = load_draft(source)
    d = decide(spec, UpgradeOptions(fc_norm=False, norm_output=False), None)  # K then follows T in the config
    plan = build_plan(spec, d, plan_vocab(spec, d.vocab_size), get_dialect("vllm"))
    count = iter(range(100))

    def output() -> str:
        out = str(base / f"out{next(count)}")
        assert run_cli(["upgrade", source, out, "--no-fc-norm", "--no-norm-output", "--format", "json"]).exit_code == 0
        return out

    return plan, d, output


def test_the_intact_output_reads_back_clean(upgraded):
    plan, d, output = upgraded
    assert readback_findings(load_draft(output()), plan, d, "read as vllm") == []


@pytest.mark.parametrize("code", READBACK_CODES)
def test_each_broken_output_fires_its_rule(upgraded, code):
    plan, d, output = upgraded
    out = load_draft(BREAKS[code](output()))
    fired = readback_findings(out, plan, d, "read as vllm")
    assert {f.code for f in fired} == {code}, [(f.code, f.message) for f in fired]
    rule = next(r for r in all_rules() if r.code == code)
    assert all(f.severity == rule.severity == "error" and f.message.endswith("(read as vllm)") for f in fired)
    assert explain(code).title == rule.title
    assert not [f for f in run_rules(out, engine="all", deep=True).findings if f.code in READBACK_CODES]


def test_upgrade_refuses_an_output_its_read_back_rejects(tmp_path, monkeypatch):
    """The write path itself: a plan that disagrees with what the writer put down is refused, nothing published."""
    import eaglekit.upgrade.check as check

    source = make_draft(str(tmp_path / "source"), "vllm")
    real = check.readback_findings

    def stricter(out, plan, d, how):
        planned = type(plan)([s for s in plan.steps if s.name != "fc.weight"], plan.recipes)
        return real(out, planned, d, how)

    monkeypatch.setattr(check, "readback_findings", stricter)
    result = run_cli(["upgrade", source, str(tmp_path / "out")])
    assert result.exit_code == 1 and "[EK191]" in result.stderr and "'fc.weight' not planned" in result.stderr
    assert not (tmp_path / "out").exists()
