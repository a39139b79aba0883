"""Acceptance by category, with bootstrap intervals over conversations, and paired differences between drafts.

τ over a set of prompts is a ratio (1 + accepted / drafts, pooled over rounds), so its uncertainty comes from
which prompts were drawn, not from rounds being independent: rounds of one prompt are strongly correlated. The
interval resamples whole conversations (all turns of one SPEED-Bench row together) with replacement and takes
the percentile interval of the pooled τ. A paired interval resamples the same conversations for both drafts,
which removes the prompt-difficulty noise both share.

Below MIN_SAMPLES resampling units no interval is estimated, nor a percentile above the median: a bootstrap of
two requests has only the spread of those two to show, and a "p99" of two is their maximum. Reports carry the
estimate with `too_few_samples` instead, and every renderer says so rather than print a bracket.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from eaglekit.decode.metrics import AcceptanceCounter

RESAMPLES = 2000
LEVEL = 0.95
SEED = 0
MIN_SAMPLES = 10  # the fewest conversations, prompts or requests an interval or a tail percentile is estimated from


def too_few(samples: int) -> bool:
    """Whether `samples` resampling units are below the floor an interval or a tail percentile needs."""
    return samples < MIN_SAMPLES


def too_few_text(samples: int) -> str:
    """What every output prints instead of an interval or a tail percentile below the floor."""
    return f"too few to estimate (n={samples}, needs {MIN_SAMPLES})"


def sample_marker(samples: int) -> dict[str, Any]:
    """The JSON beside an estimate: how many units it rests on, and whether that is below the floor."""
    return {"samples": samples, "too_few_samples": too_few(samples)}


@dataclass(frozen=True)
class Interval:
    low: float
    high: float
    level: float = LEVEL
    method: str = "bootstrap over conversations"

    def to_dict(self) -> dict:
        return {"low": self.low, "high": self.high, "level": self.level, "method": self.method}


def pooled(counters: Sequence[AcceptanceCounter], k: int) -> AcceptanceCounter:
    total = AcceptanceCounter(k)
    for c in counters:
        total.merge(c)
    return total


def _groups(counters: Sequence[AcceptanceCounter], groups: Sequence[str]) -> list[tuple[int, int]]:
    """(drafts, accepted) per conversation, in first-seen order."""
    sums: dict[str, list[int]] = {}
    for counter, group in zip(counters, groups):
        cell = sums.setdefault(group, [0, 0])
        cell[0] += counter.drafts
        cell[1] += counter.accepted
    return [(d, a) for d, a in sums.values()]


def percentile(values: list[float], q: float) -> float:
    values = sorted(values)
    position = q * (len(values) - 1)
    lower = int(position)
    upper = min(lower + 1, len(values) - 1)
    return values[lower] + (values[upper] - values[lower]) * (position - lower)


def _interval(samples: list[float], level: float) -> Interval:
    tail = (1 - level) / 2
    return Interval(percentile(samples, tail), percentile(samples, 1 - tail), level)


def _draws(n: int, resamples: int, seed: int) -> Iterator[list[int]]:
    """The bootstrap's resamples: `resamples` draws of n indices with replacement, the same for every statistic
    estimated with one seed, so τ and each position's rate are estimated over the same resampled conversations."""
    rng = random.Random(seed)
    for _ in range(resamples):
        yield [rng.randrange(n) for _ in range(n)]


def _tau(cells: Sequence[tuple[int, int]]) -> float:
    drafts = sum(d for d, _ in cells)
    return 1.0 + sum(a for _, a in cells) / drafts if drafts else 1.0


def tau_interval(counters: Sequence[AcceptanceCounter], groups: Sequence[str], *, resamples: int = RESAMPLES,
                 level: float = LEVEL, seed: int = SEED) -> Interval | None:
    """Percentile bootstrap interval of pooled τ; None below MIN_SAMPLES conversations."""
    cells = _groups(counters, groups)
    if too_few(len(cells)):
        return None
    return _interval([_tau([cells[i] for i in picks]) for picks in _draws(len(cells), resamples, seed)], level)


def per_position_intervals(counters: Sequence[AcceptanceCounter], groups: Sequence[str], *,
                           resamples: int = RESAMPLES, level: float = LEVEL, seed: int = SEED) -> list[Interval] | None:
    """tau_interval's bootstrap for each draft position's unconditional rate (pooled: rounds whose first i+1 drafts
    were accepted over all rounds), one interval per position; None below MIN_SAMPLES conversations."""
    per_group: dict[str, AcceptanceCounter] = {}
    for counter, group in zip(counters, groups):
        per_group.setdefault(group, AcceptanceCounter(counter.k)).merge(counter)
    cells = list(per_group.values())
    if too_few(len(cells)):
        return None
    samples: list[list[float]] = [[] for _ in range(cells[0].k)]
    for picks in _draws(len(cells), resamples, seed):
        drafts = sum(cells[i].drafts for i in picks)
        for position, column in enumerate(samples):
            column.append(sum(cells[i].accepted_at[position] for i in picks) / drafts if drafts else 0.0)
    return [_interval(column, level) for column in samples]


def intervals_dict(intervals: Sequence[Interval] | None) -> list[dict] | None:
    return [i.to_dict() for i in intervals] if intervals is not None else None


def _pair_interval(pairs: list[tuple[Any, Any]], statistic: Callable[[list[tuple[Any, Any]]], float], method: str,
                   resamples: int, level: float, seed: int) -> Interval | None:
    """Percentile bootstrap interval of `statistic` over `pairs` resampled whole (both sides of a pair together);
    None below MIN_SAMPLES pairs or with no finite resample."""
    if too_few(len(pairs)):
        return None
    rng = random.Random(seed)
    n = len(pairs)
    samples = [statistic([pairs[rng.randrange(n)] for _ in range(n)]) for _ in range(resamples)]
    samples = [x for x in samples if x == x]
    if not samples:
        return None
    found = _interval(samples, level)
    return Interval(found.low, found.high, level, method)


def _ratio(numerator: float, denominator: float) -> float:
    return numerator / denominator if denominator else float("nan")


def paired_ratio_interval(numerators: Sequence[float], denominators: Sequence[float], *, resamples: int = RESAMPLES,
                          level: float = LEVEL, seed: int = SEED) -> Interval | None:
    """Percentile bootstrap interval of mean(numerators) / mean(denominators), resampling pairs (one request
    served both ways) together; None below MIN_SAMPLES pairs."""
    return _pair_interval(list(zip(numerators, denominators)),
                          lambda drawn: _ratio(sum(a for a, _ in drawn), sum(b for _, b in drawn)),
                          "paired bootstrap over requests", resamples, level, seed)


def pooled_speed_ratio_interval(spec: Sequence[tuple[int, float]], plain: Sequence[tuple[int, float]], *,
                                resamples: int = RESAMPLES, level: float = LEVEL, seed: int = SEED) -> Interval | None:
    """Bootstrap interval of the pooled speed ratio (Σ tokens / Σ seconds with the draft over the same without),
    resampling prompts, each timed both ways back to back; None below MIN_SAMPLES prompts."""
    def rate(side: list[tuple[int, float]]) -> float:
        return _ratio(sum(t for t, _ in side), sum(s for _, s in side))

    return _pair_interval([(a, b) for a, b in zip(spec, plain) if a[1] > 0 and b[1] > 0],
                          lambda drawn: _ratio(rate([a for a, _ in drawn]), rate([b for _, b in drawn])),
                          "bootstrap over prompts, each timed with and without the draft", resamples, level, seed)


def paired_difference(a: Sequence[AcceptanceCounter], b: Sequence[AcceptanceCounter], groups: Sequence[str], *,
                      resamples: int = RESAMPLES, level: float = LEVEL, seed: int = SEED
                      ) -> tuple[float, Interval | None]:
    """τ(b) − τ(a) on the same prompts, and its paired bootstrap interval (the same conversations drawn for both);
    no interval below MIN_SAMPLES conversations."""
    return mean_paired_difference([(a, b)], groups, resamples=resamples, level=level, seed=seed)


def mean_paired_difference(pairs: Sequence[tuple[Sequence[AcceptanceCounter], Sequence[AcceptanceCounter]]],
                           groups: Sequence[str], *, resamples: int = RESAMPLES, level: float = LEVEL,
                           seed: int = SEED) -> tuple[float, Interval | None]:
    """The mean over `pairs` (a, b) of τ(b) − τ(a), every pair on the same prompts (one pair per training seed),
    and its bootstrap interval drawing the same conversations for every pair: how much the mean rests on which
    prompts were drawn. The pairs' own spread (seed to seed) is not in it; no interval below MIN_SAMPLES."""
    cells = [(_groups(a, groups), _groups(b, groups)) for a, b in pairs]

    def mean_gain(picks: Sequence[int] | None) -> float:
        return sum(_tau(b if picks is None else [b[i] for i in picks])
                   - _tau(a if picks is None else [a[i] for i in picks]) for a, b in cells) / len(cells)

    point, conversations = mean_gain(None), len(cells[0][0])
    if too_few(conversations):
        return point, None
    return point, _interval([mean_gain(picks) for picks in _draws(conversations, resamples, seed)], level)


def summary(counters: Sequence[AcceptanceCounter], groups: Sequence[str], k: int) -> dict:
    """The report's row for one set of prompts (one counter each, `groups` their conversations): pooled counters,
    both rate definitions and the intervals of τ and of each position's rate (over conversations, so they are its
    samples)."""
    counter, interval, conversations = pooled(counters, k), tau_interval(counters, groups), len(set(groups))
    return {"prompts": len(counters), "conversations": conversations, "num_drafts": counter.drafts,
            "num_accepted_tokens": counter.accepted, "acceptance_length": counter.acceptance_length,
            "acceptance_length_interval": interval.to_dict() if interval else None, **sample_marker(conversations),
            "per_position_acceptance": counter.per_position,
            "per_position_acceptance_interval": intervals_dict(per_position_intervals(counters, groups)),
            "conditional_acceptance": counter.conditional}


def by_category(counters: Sequence[AcceptanceCounter], categories: Sequence[str | None], groups: Sequence[str],
                k: int) -> dict[str, dict]:
    """One summary per category, in first-seen order; prompts without a category are grouped as "uncategorised"."""
    names = ["uncategorised" if c is None else c for c in categories]
    out: dict[str, dict] = {}
    for name in dict.fromkeys(names):
        picked = [i for i, n in enumerate(names) if n == name]
        out[name] = summary([counters[i] for i in picked], [groups[i] for i in picked], k)
    return out
