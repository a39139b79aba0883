"""The target sweep's hypothesis list and its verdict rule (the decode side is covered on real targets)."""

from __future__ import annotations

import math
import statistics

import pytest

from eaglekit.decode.metrics import AcceptanceCounter
from eaglekit.verify.diagnose import Hypothesis, HypothesisResult, conclude, expected_accepted, hypotheses


def _names(hyps):
    return [h.name for h in hyps]


def test_hypotheses_for_a_sorted_declaration():
    hyps = hypotheses((2, 15, 27), (2, 15, 27), 30, (2, 15, 27), False, False)
    assert _names(hyps) == ["declared", "aux ids +1", "aux ids -1", "norm_before_residual=True", "norm_output=True"]
    assert hyps[1].aux_ids == (3, 16, 28) and hyps[2].aux_ids == (1, 14, 26)
    assert dict(hyps[3].overrides) == {"norm_before_residual": True}


def test_shifts_outside_the_target_and_duplicate_defaults_are_skipped():
    hyps = hypotheses((0, 2, 3), None, 4, (2, 2, 1), True, True)
    assert _names(hyps) == ["declared", "aux ids +1", "norm_before_residual=False", "norm_output=False"]
    default = hypotheses((1, 5, 9), None, 12, (2, 6, 9), False, False)
    assert ("engine default ids", (2, 6, 9)) in [(h.name, h.aux_ids) for h in default]


def test_unsorted_written_ids_add_every_other_block_order():
    hyps = hypotheses((2, 15, 27), (15, 2, 27), 30, (2, 15, 27), False, False)
    orders = [h.aux_order for h in hyps if h.kind == "aux-order"]
    assert len(orders) == 5 and (0, 1, 2) not in orders
    assert "fc blocks in order 15,2,27" in _names(hyps)


def _result(name, kind, rounds, probs=(), ids=(2, 15, 27), overrides=()):
    """`probs`: per position, the chain's probabilities of the target's tokens by depth (a bare float = depth 1)."""
    counter = AcceptanceCounter(3)
    for accepted in rounds:
        counter.record(accepted)
    chains = [list(p) if isinstance(p, (list, tuple)) else [p] for p in probs]
    return HypothesisResult(Hypothesis(name, kind, ids, overrides), counter, [c[0] > 0.5 for c in chains], chains)


def test_a_large_tau_gain_is_a_mismatch_with_a_fix():
    declared = _result("declared", "declared", [0, 1, 0, 0], [0.1] * 20)
    shifted = _result("aux ids -1", "aux-shift", [2, 3, 2, 1], [0.9] * 20, ids=(1, 14, 26))
    d = conclude([declared, shifted])
    assert d.verdict == "mismatch" and d.best == "aux ids -1"
    assert d.fix == "eaglekit upgrade DRAFT OUT --aux-layer-ids 1,14,26 --aux-convention input"
    assert "off by -1" in d.message and "teacher-forced τ 1.90 vs 1.10" in d.message


def _paired(gains, base=0.4):
    """Depth-1 chains of a declared reading and of one whose per-position gain over it is `gains`."""
    return [base] * len(gains), [base + g for g in gains]


def test_a_small_tau_gain_counts_only_with_a_significant_paired_chain_gain():
    rounds, better_rounds = [1] * 50, [1] * 49 + [2]
    gains = [0.3, 0.1, 0.2, -0.05] * 10  # mean 0.1375, sd 0.13, n 40: z ≈ 6.7
    p_declared, p_better = _paired(gains)
    declared = _result("declared", "declared", rounds, p_declared)
    better = _result("aux ids +1", "aux-shift", better_rounds, p_better, ids=(3, 16, 28))
    z, n = better.paired_z(declared)
    assert n == 40 and z == pytest.approx(statistics.mean(gains) / (statistics.stdev(gains) / 40 ** 0.5))
    assert conclude([declared, better]).verdict == "mismatch"

    noisy_gains = [0.5, -0.45] * 20  # mean 0.025 on a sd of 0.48: z ≈ 0.3
    p_declared, p_noisy = _paired(noisy_gains)
    noisy = _result("aux ids +1", "aux-shift", better_rounds, p_noisy, ids=(3, 16, 28))
    assert conclude([_result("declared", "declared", rounds, p_declared), noisy]).verdict == "declared"

    # a significant probability gain without any τ gain is not a win, nor is one on too few positions
    same_tau = _result("aux ids +1", "aux-shift", rounds, p_better, ids=(3, 16, 28))
    assert conclude([declared, same_tau]).verdict == "declared"
    short_d, short_b = _paired(gains[:12])
    few = _result("aux ids +1", "aux-shift", better_rounds, short_b, ids=(3, 16, 28))
    assert conclude([_result("declared", "declared", rounds, short_d), few]).verdict == "declared"


def test_identical_readings_pair_to_zero():
    declared = _result("declared", "declared", [1, 2], [0.2, 0.0, 0.7])
    same = _result("norm_output=True", "norm_output", [1, 2], [0.2, 0.0, 0.7], overrides=(("norm_output", True),))
    assert same.paired_z(declared) == (0.0, 3)
    assert declared.first_draft_prob == pytest.approx(0.3)


def test_chains_score_the_drafts_a_round_expects_to_keep():
    assert expected_accepted([0.5, 0.4, 1.0]) == pytest.approx(0.5 + 0.2 + 0.2)
    assert expected_accepted([0.0, 0.9]) == 0.0 and expected_accepted([]) == 0.0
    r = _result("declared", "declared", [1], [[0.5, 0.4, 1.0], [1.0, 1.0, 1.0]])
    assert r.teacher_forced_acceptance_length == pytest.approx(1 + (0.9 + 3.0) / 2)
    assert r.first_draft_prob == pytest.approx(0.75)


def test_a_reading_that_only_changes_later_drafts_is_judged_on_them():
    """norm_output flips leave every first draft alone; the deeper probabilities decide (P35)."""
    rounds = [1] * 40
    declared = _result("declared", "declared", rounds, [[0.6, 0.2 + 0.01 * (i % 5), 0.1] for i in range(40)])
    flipped = _result("norm_output=True", "norm_output", rounds[:-1] + [2],
                      [[0.6, 0.5 + 0.01 * (i % 7), 0.4] for i in range(40)], overrides=(("norm_output", True),))
    assert flipped.first_draft_prob == declared.first_draft_prob
    z, n = flipped.paired_z(declared)
    assert n == 40 and z > 10
    d = conclude([declared, flipped])
    assert d.verdict == "mismatch" and d.fix == 'set "norm_output": true in the draft\'s config.json'


def test_norm_flag_fix_names_the_config_key():
    declared = _result("declared", "declared", [1, 0, 1, 0])
    flipped = _result("norm_output=True", "norm_output", [3, 3, 2, 3], overrides=(("norm_output", True),))
    d = conclude([declared, flipped])
    assert d.verdict == "mismatch" and d.fix == 'set "norm_output": true in the draft\'s config.json'


def test_tau_near_one_everywhere_is_broken():
    d = conclude([_result("declared", "declared", [0] * 10), _result("aux ids +1", "aux-shift", [0] * 10)])
    assert d.verdict == "broken" and "P1" in d.message


def test_rows_carry_the_paired_z_against_the_declared_reading():
    gains = [0.3, 0.1, 0.2, -0.05] * 10
    p_declared, p_better = _paired(gains)
    declared = _result("declared", "declared", [1] * 50, p_declared)
    better = _result("aux ids +1", "aux-shift", [1] * 49 + [2], p_better, ids=(3, 16, 28))
    rows = conclude([declared, better]).result_rows()
    assert (rows[0]["paired_z"], rows[0]["paired_positions"]) == (None, 0)
    assert rows[1]["paired_z"] == pytest.approx(better.paired_z(declared)[0]) and rows[1]["paired_positions"] == 40
    # every position gains exactly the same: z is infinite, which JSON cannot carry
    flat = _result("declared", "declared", [1] * 50, [0.25] * 40)
    constant = _result("aux ids -1", "aux-shift", [1] * 50, [0.5] * 40, ids=(1, 14, 26))
    assert constant.paired_z(flat)[0] == math.inf
    assert conclude([flat, constant]).result_rows()[1]["paired_z"] is None
