"""verify against the real SmolLM2-135M-Instruct target with the bundled trained drafters.

Bracket proposers (oracle τ = k+1, random τ ≈ 1), the trained EAGLE-3 and EAGLE-3.1 drafters (τ well above 1,
lossless), both with their aux ids shifted by one (EAGLE-3 loses τ; --diagnose names the shift for both), the
3.1 drafter served without its norm_output flag (named), and each drafter as published (no finding).
"""

from __future__ import annotations

import json
import os
import shutil

import pytest

pytest.importorskip("torch")

from eaglekit.decode.options import VerifyOptions  # noqa: E402
from eaglekit.decode.prompts import bundled_prompts, encode  # noqa: E402
from eaglekit.decode.speculative import (  # noqa: E402
    LiveVerifier,
    OracleProposer,
    RandomProposer,
    greedy_decode,
    speculative_decode,
)
from eaglekit.verify.run import verify  # noqa: E402
from tests.support import REPO  # noqa: E402

pytestmark = pytest.mark.model

DRAFTERS = os.path.join(str(REPO), "examples", "drafters")
EAGLE3 = os.path.join(DRAFTERS, "smollm2-135m-eagle3")
EAGLE31 = os.path.join(DRAFTERS, "smollm2-135m-eagle3.1")
PROMPTS = 4  # enough for what each test below resolves; the 3.1 shift needs twice as many
# The shifted copies are decoded as eaglekit reads them only (as_eaglekit_reads): vLLM serves them with the ids they
# declare, and the served section's second decode of such a reading is tested in test_verify_served.py and, on
# SmolLM2 against the real engine, in test_engine_vllm.py.
NEW = 64


@pytest.fixture(scope="module")
def prompt_ids(smollm2):
    return [encode(p, smollm2.tokenizer) for p in bundled_prompts().prompts[:2]]


def test_oracle_and_random_bracket_the_metric(smollm2, prompt_ids):
    k = 3
    for ids in prompt_ids:
        plain = greedy_decode(smollm2, ids, max_new_tokens=24)
        reference = greedy_decode(smollm2, ids, max_new_tokens=24 + k + 1).tokens
        oracle = speculative_decode(LiveVerifier(smollm2, ()), OracleProposer(reference), ids, k=k, max_new_tokens=24)
        assert oracle.tokens == plain.tokens and oracle.counter.acceptance_length == k + 1
        rand = speculative_decode(LiveVerifier(smollm2, ()), RandomProposer(smollm2.vocab_size), ids, k=k,
                                  max_new_tokens=24)
        assert rand.tokens == plain.tokens and rand.counter.acceptance_length < 1.05


def _verify(draft, target, **kw):
    options = VerifyOptions(limit=kw.pop("limit", PROMPTS), max_new_tokens=kw.pop("max_new_tokens", NEW), **kw)
    return verify(draft, target, options)


@pytest.fixture(scope="module")
def eagle3_report(smollm2_dir):
    return _verify(EAGLE3, smollm2_dir, diagnose=True)


def test_trained_eagle3_drafter_is_lossless_and_accepts(eagle3_report):
    report = eagle3_report
    assert report.lossless and report.exact
    assert report.acceptance_length >= 1.8, report.counter.per_position
    rates = report.counter.per_position
    assert rates[0] > 0.45 and rates == sorted(rates, reverse=True)
    # read as published, no competing hypothesis beats the declared one
    assert report.diagnosis.verdict == "declared", report.diagnosis.message


def test_trained_eagle31_drafter_is_lossless_and_its_feedback_stays_normalised(smollm2_dir, eagle3_report):
    report = _verify(EAGLE31, smollm2_dir, limit=4)
    assert report.lossless and report.eagle_version == "3.1"
    assert report.acceptance_length >= 1.6, report.counter.per_position
    # EAGLE-3.1 feeds back the post-norm state; EAGLE-3 the pre-norm sum, whose RMS is an order larger here
    rms31 = [row["hidden_rms"] for row in report.drift.rows()[1:]]
    rms3 = [row["hidden_rms"] for row in eagle3_report.drift.rows()[1:]]
    assert max(rms31) < 5 < min(rms3)


def _shifted_copy(source, dst) -> str:
    """`source` with its written aux ids moved one layer deeper: the classic off-by-one."""
    shutil.copytree(source, dst)
    config = json.loads((dst / "config.json").read_text())
    written = config["eagle_config"]["eagle_aux_hidden_state_layer_ids"]
    config["eagle_config"]["eagle_aux_hidden_state_layer_ids"] = [i + 1 for i in written]
    (dst / "config.json").write_text(json.dumps(config))
    return ",".join(str(i + 1) for i in written)  # SpecForge writes output-of-layer ids: input-of-layer = +1


def test_shifted_aux_ids_lower_acceptance_and_diagnose_names_the_shift(smollm2_dir, eagle3_report, tmp_path,
                                                                        monkeypatch):
    true_ids = _shifted_copy(EAGLE3, tmp_path / "shifted")
    bad = _verify(str(tmp_path / "shifted"), smollm2_dir, diagnose=True, as_eaglekit_reads=True)
    assert bad.lossless
    assert bad.acceptance_length <= eagle3_report.acceptance_length - 0.1
    d = bad.diagnosis
    assert d.verdict == "mismatch" and d.best == "aux ids -1", [r.to_dict() for r in d.results]
    assert f"--aux-layer-ids {true_ids} " in d.fix
    # the fix as verify prints it runs as printed and writes the draft's true ids
    import shlex

    from eaglekit.cli.verify import runnable_fix
    from eaglekit.families import load_draft
    from tests.support.cli import run_cli

    command = shlex.split(runnable_fix(d.fix, str(tmp_path / "shifted")))
    monkeypatch.chdir(tmp_path)
    assert run_cli(command[1:]).exit_code == 0
    fixed = load_draft(str(tmp_path / "shifted-diagnosed"))
    assert sorted(fixed.aux.ids) == sorted(int(i) for i in true_ids.split(","))
    # the replayed readings reproduce the live runs: declared = the shifted run, "-1" = the original drafter
    by_name = {r.hypothesis.name: r.counter.acceptance_length for r in d.results}
    assert by_name["declared"] == pytest.approx(bad.acceptance_length, abs=0.1)
    assert by_name["aux ids -1"] == pytest.approx(eagle3_report.acceptance_length, abs=0.1)


def test_diagnose_names_a_shift_the_eagle31_drafter_barely_feels(smollm2_dir, tmp_path):
    """fc_norm rescales each aux state, so one layer off costs the 3.1 drafter little τ; the paired first-draft
    probabilities still separate the readings."""
    true_ids = _shifted_copy(EAGLE31, tmp_path / "shifted")
    d = _verify(str(tmp_path / "shifted"), smollm2_dir, diagnose=True, limit=2 * PROMPTS,  # a small effect
                as_eaglekit_reads=True).diagnosis
    assert d.verdict == "mismatch" and d.best == "aux ids -1", [r.to_dict() for r in d.results]
    assert f"--aux-layer-ids {true_ids} " in d.fix


def test_diagnose_names_a_lost_norm_output_flag(smollm2_dir, tmp_path):
    """The EAGLE-3.1 drafter with `norm_output: false`, as a runtime or converter that drops the flag serves it
    (P9, P38): first drafts are unchanged, later ones suffer, and the sweep names the flag."""
    draft = tmp_path / "lost-flag"
    shutil.copytree(EAGLE31, draft)
    config = json.loads((draft / "config.json").read_text())
    (draft / "config.json").write_text(json.dumps({**config, "norm_output": False}))
    d = _verify(str(draft), smollm2_dir, diagnose=True).diagnosis
    assert d.verdict == "mismatch" and d.best == "norm_output=True", [r.to_dict() for r in d.results]
    assert d.fix == 'set "norm_output": true in the draft\'s config.json'
    by_name = {r.hypothesis.name: r for r in d.results}
    assert by_name["norm_output=True"].first_draft_prob == pytest.approx(by_name["declared"].first_draft_prob)
