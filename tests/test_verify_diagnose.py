"""The target sweep's hypothesis list and its verdict rule (the decode side is covered on real targets)."""

from __future__ import annotations

from eaglekit.verify.diagnose import Hypothesis, HypothesisResult, conclude, hypotheses
from eaglekit.verify.metrics import AcceptanceCounter


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


def _result(name, kind, rounds, hits, ids=(2, 15, 27), overrides=()):
    counter = AcceptanceCounter(3)
    for accepted in rounds:
        counter.record(accepted)
    return HypothesisResult(Hypothesis(name, kind, ids, overrides), counter, hits)


def test_a_large_tau_gain_is_a_mismatch_with_a_fix():
    declared = _result("declared", "declared", [0, 1, 0, 0], [False] * 20)
    shifted = _result("aux ids -1", "aux-shift", [2, 3, 2, 1], [True] * 20, ids=(1, 14, 26))
    d = conclude([declared, shifted])
    assert d.verdict == "mismatch" and d.best == "aux ids -1"
    assert d.fix == "eaglekit upgrade DRAFT --aux-layer-ids 1,14,26 --aux-convention input"
    assert "off by -1" in d.message


def test_a_small_gain_counts_only_when_the_paired_first_drafts_are_significantly_better():
    rounds = [1] * 50
    declared = _result("declared", "declared", rounds, [True] * 50 + [False] * 50)
    better = _result("aux ids +1", "aux-shift", rounds[:-1] + [2], [True] * 50 + [True] * 20 + [False] * 30,
                     ids=(3, 16, 28))
    assert conclude([declared, better]).verdict == "mismatch"  # 20 better, 0 worse: z = 4.5
    noisy = _result("aux ids +1", "aux-shift", rounds[:-1] + [2], [True] * 45 + [False] * 5 + [True] * 8 + [False] * 42,
                    ids=(3, 16, 28))
    assert conclude([declared, noisy]).verdict == "declared"  # 8 better, 5 worse: not significant


def test_norm_flag_fix_names_the_config_key():
    declared = _result("declared", "declared", [1, 0, 1, 0], [])
    flipped = _result("norm_output=True", "norm_output", [3, 3, 2, 3], [], overrides=(("norm_output", True),))
    d = conclude([declared, flipped])
    assert d.verdict == "mismatch" and d.fix == 'set "norm_output": true in the draft\'s config.json'


def test_tau_near_one_everywhere_is_broken():
    d = conclude([_result("declared", "declared", [0] * 10, []), _result("aux ids +1", "aux-shift", [0] * 10, [])])
    assert d.verdict == "broken" and "P1" in d.message
