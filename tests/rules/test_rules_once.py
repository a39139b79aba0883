"""Every command runs the rules once and shows views of that one report: each rule is evaluated at most once per
command (once per engine it judges), counted at the registry on real drafts through the real entry point."""

from __future__ import annotations

import dataclasses
from collections import Counter

import pytest

import eaglekit.rules.registry as registry
from tests.support.cli import run_cli
from tests.support.factory import make_draft, make_target_config

pytestmark = pytest.mark.model

ALWAYS = "EK101"  # an engine-neutral structure rule: every rules run evaluates it


@pytest.fixture
def evaluations(monkeypatch) -> Counter:
    """(rule code, engine) -> how many times its check ran, from here on."""
    counts: Counter = Counter()

    def counted(rule):
        def check(ctx):
            counts[rule.code, ctx.engine] += 1
            return rule.check(ctx)
        return dataclasses.replace(rule, check=check)

    monkeypatch.setattr(registry, "_RULES", {code: counted(r) for code, r in registry._RULES.items()})
    return counts


def assert_one_run(counts: Counter) -> None:
    assert counts[ALWAYS, None] == 1, counts
    assert max(counts.values()) == 1, [key for key, n in counts.items() if n > 1]


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    base = tmp_path_factory.mktemp("once")
    return {"draft": make_draft(str(base / "draft"), "specforge"),
            "target": make_target_config(str(base / "target"))}


@pytest.mark.parametrize("args", [["inspect"], ["inspect", "--target", "TARGET"], ["validate"],
                                  ["validate", "--target", "TARGET"], ["validate", "--engine", "all"]], ids=" ".join)
def test_inspect_and_validate_run_the_rules_once(files, evaluations, args):
    command, *rest = [files["target"] if a == "TARGET" else a for a in args]
    result = run_cli([command, files["draft"], *rest, "--format", "json"])
    assert result.exit_code in (0, 1), result.stderr  # validate exits 1 on the draft's errors
    assert_one_run(evaluations)
    every = {None, "vllm", "sglang", "trtllm", "llamacpp", "tokenspeed"}
    assert {engine for _, engine in evaluations} == (every if command == "inspect" or "all" in args else {None, "vllm"})


def test_push_dry_run_runs_the_rules_once(files, evaluations):
    result = run_cli(["push", files["draft"], "--repo-id", "org/draft", "--dry-run", "--offline", "--force", "--format",
                      "json"])
    assert result.exit_code == 0, result.stderr
    assert_one_run(evaluations)
    assert {engine for _, engine in evaluations} >= {"vllm", "sglang", "trtllm", "llamacpp", "tokenspeed"}


def test_verify_runs_the_rules_once(tmp_path, evaluations):
    pytest.importorskip("torch")
    from tests.support.smollm2 import smollm2_path
    from tests.support.targets import make_tiny_target

    vocab = 49152  # SmolLM2's tokenizer
    target = make_tiny_target(tmp_path / "target", vocab=vocab, tokenizer_from=smollm2_path())
    draft = make_draft(str(tmp_path / "draft"), "specforge", hidden=64, vocab=vocab, draft_vocab=512,
                       aux_ids=(1, 2, 3), target_layers=4)
    evaluations.clear()
    result = run_cli(["verify", draft, "--target", target, "--limit", "1", "--max-new-tokens", "4", "--no-progress",
                      "--format", "json"])
    assert result.exit_code == 0, result.stderr
    assert_one_run(evaluations)
