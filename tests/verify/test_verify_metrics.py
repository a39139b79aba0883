"""Acceptance metrics follow vLLM's definitions; drift statistics average per depth."""

from __future__ import annotations

import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from eaglekit.decode.metrics import AcceptanceCounter, DriftStats


def test_vllm_definitions_on_a_worked_example():
    c = AcceptanceCounter(3)
    for accepted in (3, 0, 1, 2):
        c.record(accepted)
    assert c.drafts == 4 and c.draft_tokens == 12 and c.accepted == 6
    assert c.acceptance_length == pytest.approx(1 + 6 / 4)
    assert c.per_position == pytest.approx([3 / 4, 2 / 4, 1 / 4])
    assert c.conditional == pytest.approx([3 / 4, 2 / 3, 1 / 2])
    assert c.draft_acceptance_rate == pytest.approx(6 / 12)


@given(st.integers(1, 8), st.lists(st.integers(0, 100), max_size=200), st.integers(0, 2**32 - 1))
def test_tau_is_one_plus_sum_of_unconditional_rates(k, raw, seed):
    c = AcceptanceCounter(k)
    for value in raw:
        c.record(value % (k + 1))
    assert c.acceptance_length == pytest.approx(1 + sum(c.per_position))
    assert all(a >= b for a, b in zip(c.per_position, c.per_position[1:]))
    assert 1.0 <= c.acceptance_length <= k + 1
    # merging split counts gives the same totals
    left, right = AcceptanceCounter(k), AcceptanceCounter(k)
    rng = random.Random(seed)
    for value in raw:
        (left if rng.random() < 0.5 else right).record(value % (k + 1))
    left.merge(right)
    assert (left.drafts, left.accepted, left.accepted_at) == (c.drafts, c.accepted, c.accepted_at)


def test_bounds_and_empty_counter():
    c = AcceptanceCounter(2)
    assert c.acceptance_length == 1.0 and c.per_position == [0.0, 0.0]
    with pytest.raises(ValueError):
        c.record(3)
    with pytest.raises(ValueError):
        c.merge(AcceptanceCounter(3))


def test_drift_means_per_depth():
    d = DriftStats(2)
    d.record(1, 2.0, 0.5)
    d.record(1, 4.0, None)
    d.record(2, 8.0, 0.25)
    rows = d.rows()
    assert rows[0] == {"depth": 1, "hidden_rms": 3.0, "sink_attention": 0.5, "samples": 2}
    assert rows[1] == {"depth": 2, "hidden_rms": 8.0, "sink_attention": 0.25, "samples": 1}
    other = DriftStats(2)
    other.record(2, 0.0, 0.75)
    d.merge(other)
    assert d.rows()[1]["hidden_rms"] == 4.0 and d.rows()[1]["sink_attention"] == 0.5


def test_the_speed_ratio_interval_resamples_prompts_timed_both_ways():
    from eaglekit.decode.stats import pooled_speed_ratio_interval

    assert pooled_speed_ratio_interval([(10, 1.0)], [(10, 1.0)]) is None  # one prompt: no spread
    steady = pooled_speed_ratio_interval([(20, 1.0)] * 10, [(10, 1.0)] * 10)
    assert steady is not None and steady.low == steady.high == 2.0
    noisy = pooled_speed_ratio_interval([(20, 1.0), (20, 4.0), (20, 1.0), (20, 5.0)] * 3, [(10, 1.0)] * 12)
    assert noisy is not None and noisy.low < 1.0 < noisy.high  # a spread that holds 1x: the ratio says nothing


def _counter(k: int, rounds: list[int]) -> AcceptanceCounter:
    c = AcceptanceCounter(k)
    for accepted in rounds:
        c.record(accepted)
    return c


def test_each_draft_positions_rate_has_a_bootstrap_interval_over_conversations():
    from eaglekit.decode.stats import MIN_SAMPLES, per_position_intervals, tau_interval

    steady = [_counter(3, [3, 1, 0, 2])] * MIN_SAMPLES  # every conversation alike: no spread at any depth
    groups = [f"c{i}" for i in range(MIN_SAMPLES)]
    intervals = per_position_intervals(steady, groups)
    assert intervals is not None and [(i.low, i.high) for i in intervals] == [(0.75, 0.75), (0.5, 0.5), (0.25, 0.25)]
    assert per_position_intervals(steady[:-1], groups[:-1]) is None  # too few conversations to estimate

    rng = random.Random(7)
    mixed = [_counter(3, [rng.randint(0, 3) for _ in range(12)]) for _ in range(2 * MIN_SAMPLES)]
    pooled = _counter(3, [])
    for c in mixed:
        pooled.merge(c)
    as_pairs = [f"turns-{i // 2}" for i in range(2 * MIN_SAMPLES)]  # two turns per conversation: resampled together
    intervals = per_position_intervals(mixed, as_pairs)
    assert intervals is not None and len(intervals) == 3
    for rate, interval in zip(pooled.per_position, intervals):
        assert 0 <= interval.low < rate < interval.high <= 1
    # drawn with τ's seed over the same conversations: at k = 1, τ = 1 + the one rate in every resample
    single = [_counter(1, [rng.randint(0, 1) for _ in range(12)]) for _ in range(MIN_SAMPLES)]
    tau, (rate,) = tau_interval(single, groups), per_position_intervals(single, groups) or [None]
    assert tau is not None and rate is not None and rate.low < rate.high
    assert (tau.low, tau.high) == pytest.approx((1 + rate.low, 1 + rate.high), abs=1e-12)
