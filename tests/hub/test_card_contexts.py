"""The model card says where a drafter holds and where it drifts: τ per context length and the acceptance rate at
each draft depth, each with its 95 % interval and n, read from a verify sweep's report: one built through the
report's own classes from recorded rounds, and one the real decode wrote (a tiny target with SmolLM2's tokenizer)."""

from __future__ import annotations

import dataclasses
import json
import os
import random

import jsonschema
import pytest

from eaglekit.decode.metrics import AcceptanceCounter, DriftStats
from eaglekit.decode.settings import DecodeSettings
from eaglekit.decode.speculative import Clock
from eaglekit.decode.stats import MIN_SAMPLES
from eaglekit.families import load_draft
from eaglekit.provenance import measured_files
from eaglekit.target import read_target
from eaglekit.verify.report import PromptOutcome, VerifyReport, VerifySweep
from tests.support import REPO as CHECKOUT  # the checkout (REPO here is a Hub repository id)
from tests.support.cli import run_cli
from tests.support.factory import make_draft, make_target_config

ROOT = str(CHECKOUT)
SCHEMA = json.load(open(os.path.join(ROOT, "eaglekit", "schemas", "verify-report.schema.json")))
VOCAB = 49152  # SmolLM2's tokenizer
REPO = "eagle-org/tiny-draft"


def table(card: str, heading: str) -> list[list[str]]:
    """The body rows of the first table after `heading`, as cells."""
    after = card[card.index(heading):].splitlines()
    lines = [line for line in after[after.index(next(li for li in after if li.startswith("|"))):]]
    rows = []
    for line in lines[2:]:
        if not line.startswith("|"):
            break
        rows.append([cell.strip() for cell in line.strip().strip("|").split("|")])
    return rows


def two(value: float) -> str:
    return f"{value:,.2f}"


def interval_cell(condition: dict, interval: dict | None) -> str:
    """An interval as the card writes it: low–high, or n and why there is none."""
    if condition["too_few_samples"]:
        return f"n={condition['samples']}, too few to estimate an interval"
    assert interval is not None
    return f"{two(interval['low'])}–{two(interval['high'])}"


def expected_rows(report: dict) -> tuple[list[list[str]], list[list[str]]]:
    """The card's two tables as the report's own figures give them: τ per condition, then each depth's rate."""
    by_context, by_depth = [], []
    for c in report["conditions"]:
        by_context.append([c["template"], f"{c['context_tokens']:,}", two(c["acceptance_length"]),
                           interval_cell(c, c["acceptance_length_interval"]), str(c["samples"]),
                           "yes" if c["lossless"] else "**no**"])
        bounds = c["per_position_acceptance_interval"] or [None] * len(c["per_position_acceptance"])
        for depth, (rate, given, interval) in enumerate(zip(c["per_position_acceptance"],
                                                            c["conditional_acceptance"], bounds), 1):
            by_depth.append([c["template"], f"{c['context_tokens']:,}", str(depth), two(rate),
                             interval_cell(c, interval), two(given), str(c["samples"])])
    return by_context, by_depth


def card_rows_as_expected(tmp_path, draft: str, target: str, saved, report: dict):
    """The card `push --dry-run` writes from the saved report: its context and depth tables hold the report's
    figures row for row; returns those rows."""
    card_file = tmp_path / "card.md"
    pushed = run_cli(["push", draft, "--repo-id", REPO, "--target", target, "--report", str(saved), "--dry-run",
                      "--offline", "--card-out", str(card_file)])
    assert pushed.exit_code == 0, pushed.stderr
    card = card_file.read_text()
    by_context, by_depth = expected_rows(report)
    assert table(card, "### τ by context length") == by_context
    assert table(card, "### Acceptance by draft depth") == by_depth
    return by_context, by_depth


@pytest.mark.model
def test_a_card_from_a_verify_sweep_shows_tau_by_context_and_acceptance_by_depth(tmp_path):
    pytest.importorskip("torch")
    from tests.support.smollm2 import smollm2_path
    from tests.support.targets import make_tiny_target

    target = make_tiny_target(tmp_path / "target", vocab=VOCAB, tokenizer_from=smollm2_path())
    draft = make_draft(str(tmp_path / "draft"), "vllm", hidden=64, vocab=VOCAB, draft_vocab=512, aux_ids=(1, 2, 3),
                       target_layers=4)
    saved = tmp_path / "verify.json"
    result = run_cli(["verify", draft, "--target", target, "--context-tokens", "0,24", "--limit", str(MIN_SAMPLES),
                      "--max-new-tokens", "8", "--no-progress", "--format", "json", "--save-report", str(saved)])
    assert result.exit_code == 0, result.stderr
    report = json.loads(saved.read_text())
    jsonschema.validate(report, SCHEMA)
    assert [c["context_tokens"] for c in report["conditions"]] == [0, 24]
    for c in report["conditions"]:  # ten prompts: every interval is estimated
        assert c["samples"] == MIN_SAMPLES and not c["too_few_samples"]
        assert len(c["per_position_acceptance_interval"]) == 3

    card_rows_as_expected(tmp_path, draft, target, saved, report)


def sweep_report(draft: str, target: str) -> dict:
    """A verify sweep's JSON as VerifySweep writes it, from counters of recorded rounds: at no extra context the
    draft holds, at 2,048 tokens it drifts, at 8,192 too few conversations were decoded for an interval."""
    rng = random.Random(3)
    settings = DecodeSettings(target=target, num_speculative_tokens=3, max_new_tokens=64, dtype="bfloat16",
                              device="cpu", prompts_name="mt-bench", context_tokens=0)
    reports = []
    for context, conversations, best in ((0, 12, 3), (2048, 12, 1), (8192, 4, 1)):
        outcomes, total = [], AcceptanceCounter(3)
        for i in range(conversations):
            counter = AcceptanceCounter(3)
            for _ in range(16):
                counter.record(min(rng.randint(0, 3), rng.randint(0, best)))
            total.merge(counter)
            outcomes.append(PromptOutcome(f"p{i}", 40 + context, 64, counter.acceptance_length, True,
                                          conversation=f"c{i}", counter=counter, spec_s=1.0, target_s=1.5,
                                          target_tokens=64))
        reports.append(VerifyReport(
            draft=draft, settings=dataclasses.replace(settings, context_tokens=context), eagle_version="3",
            flags={}, aux_layer_ids=[1, 2, 3], aux_layer_ids_source="config", chat_template=True, checks=[],
            counter=total, drift=DriftStats(3), spec_clock=Clock(total_s=float(conversations)),
            target_only_s=1.5 * conversations, spec_tokens=64 * conversations, target_tokens=64 * conversations,
            outcomes=outcomes, tie_tolerance=0.0, measured=measured_files(load_draft(draft), read_target(target))))
    return VerifySweep(reports).to_dict()


def test_a_card_shows_where_the_draft_holds_and_where_it_drifts_with_context(tmp_path):
    draft = make_draft(str(tmp_path / "draft"), "vllm")
    target = make_target_config(str(tmp_path / "target"))
    report = sweep_report(draft, target)
    jsonschema.validate(report, SCHEMA)
    held, drifted, unsure = report["conditions"]
    assert held["acceptance_length_interval"]["low"] > drifted["acceptance_length_interval"]["high"]
    assert unsure["too_few_samples"] and unsure["per_position_acceptance_interval"] is None
    saved = tmp_path / "verify.json"
    saved.write_text(json.dumps(report))

    by_context, by_depth = card_rows_as_expected(tmp_path, draft, target, saved, report)
    assert len(by_depth) == 9 and by_context[2][3] == "n=4, too few to estimate an interval"
