"""What `eaglekit bench` measured: per concurrency (and category), the target served alone and with the draft.

Every figure comes from vLLM's own benchmark client (`vllm bench serve`) and the server's spec-decode counters;
this module only pairs the two runs and says where speculation stops paying.

- per-user output tokens/s of one request: its output tokens over its end-to-end latency (what one user sees,
  first token included); reported as mean, p50 and p99, where p99 is the rate 99 % of requests reach or beat
  (the 1st percentile of rates, the slow tail, as p99 latency is).
- speed-up: mean per-user tokens/s with the draft over the same without it, measured in the same run on the same
  requests, with a paired bootstrap interval over requests.
- below MIN_SAMPLES requests neither the interval nor any p99 is estimated (`too_few_samples`), and the verdict
  calls the speed-up unresolved.
- pooled τ (1 + Σ accepted / Σ drafting rounds) and per-position acceptance: the server's counters
  (vllm:spec_decode_*) under the settings `acceptance_settings` records, read before and after each measurement
  (warm-ups outside it): on a server eaglekit started, the measured requests only; on a running one (--base-url),
  whatever else it served meanwhile too.
- a running server measured without its no-spec twin (--base-url without --baseline-url) has no baseline: its rows
  carry τ, latencies and throughput, no speed-up and no verdict.
- percentiles: p50 and p99 always, and those asked for (--percentiles); none above the median below MIN_SAMPLES.
- a row belongs to a series: its k (a sweep serves the draft once per k), its input-length bucket and its category;
  each series gets its own verdict.
- goodput (--goodput ttft:MS tpot:MS e2el:MS): the requests meeting every SLO, by vLLM's client's own rule
  (vllm/benchmarks/serve.py, calculate_metrics: TPOT of a one-token output counts as 0), and their rate.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from eaglekit.decode.sampling import Sampling
from eaglekit.decode.stats import (
    MIN_SAMPLES,
    Interval,
    paired_ratio_interval,
    percentile,
    sample_marker,
    too_few,
    too_few_text,
)
from eaglekit.engines.vllm import acceptance_settings as settings_block
from eaglekit.runtime.endpoint import SpecCounters

SCHEMA_VERSION = "1"
PAYS = 1.0  # a speed-up above this pays
REPORTED_PERCENTILES = (50.0, 99.0)  # always in a report (its p50 and p99 keys), whatever else is asked for


def percentile_key(q: float) -> str:
    """A percentile's name as vLLM's client writes it (`p99`, `p99.9`)."""
    return f"p{int(q) if int(q) == q else q}"


def chosen_percentiles(asked: Sequence[float]) -> tuple[float, ...]:
    """The percentiles a run reports: those asked for, with the median and p99 the report always carries."""
    return tuple(sorted({*REPORTED_PERCENTILES, *(float(q) for q in asked)}))


@dataclass(frozen=True)
class Spread:
    mean: float
    p50: float
    p99: float | None  # None below MIN_SAMPLES requests
    others: tuple[tuple[float, float | None], ...] = ()  # further percentiles asked for; above 50 None below the floor

    def to_dict(self) -> dict[str, float | None]:
        shown = sorted([(50.0, self.p50), (99.0, self.p99), *self.others])
        return {"mean": round(self.mean, 4),
                **{percentile_key(q): None if v is None else round(v, 4) for q, v in shown}}


def spread(values: Sequence[float], *, slow_tail_low: bool = False,
           percentiles: Sequence[float] = REPORTED_PERCENTILES) -> Spread:
    """mean and percentiles; for rates (`slow_tail_low`) pQ is the rate Q % of values reach or beat (the (100-Q)th
    percentile), as for times it is the value Q % stay within. No percentile above the median below MIN_SAMPLES
    values."""
    few = too_few(len(values))
    values = list(values) or [0.0]

    def at(q: float) -> float | None:
        if q > 50 and few:
            return None
        return percentile(values, (100 - q) / 100 if slow_tail_low else q / 100)

    others = tuple((float(q), at(q)) for q in percentiles if float(q) not in REPORTED_PERCENTILES)
    return Spread(sum(values) / len(values), percentile(values, 0.5), at(99.0), others)


GOODPUT_METRICS = ("ttft", "tpot", "e2el")
"""The latencies vLLM's --goodput takes an SLO of (vllm/benchmarks/serve.py, check_goodput_args)."""


def good_requests(result: Mapping[str, Any], slo_ms: Mapping[str, float]) -> int:
    """How many requests of a detailed `bench serve` result meet every SLO in `slo_ms`, as vLLM's client counts
    them: TTFT, TPOT (the time after the first token over the tokens after it; 0 for one token) and E2EL each at
    most its SLO."""
    good = 0
    for ttft, latency, tokens in zip(result["ttfts"], result["latencies"], result["output_lens"]):
        measured = {"ttft": ttft, "tpot": (latency - ttft) / (tokens - 1) if tokens > 1 else 0.0, "e2el": latency}
        good += all(limit / 1000 >= measured[name] for name, limit in slo_ms.items())
    return good


LATENCIES = ("ttft", "tpot", "itl", "e2el")
"""The latencies vLLM's client measures (--percentile-metrics): time to first token, per output token after it,
between two output tokens, and end to end; each reported as `<name>_ms`."""


@dataclass(frozen=True)
class ServedRun:
    """One `bench serve` run at one concurrency: the client's figures, and the server's counters for it."""

    completed: int
    duration_s: float
    output_tokens: int
    output_throughput: float  # output tokens/s over all requests
    per_user_rates: tuple[float, ...]  # per request, in request order
    tpot_ms: Spread
    ttft_ms: Spread
    texts: tuple[str, ...]  # generated text per request, in request order
    drafts: int = 0
    draft_tokens: int = 0
    accepted: int = 0
    per_position: tuple[float, ...] = ()
    itl_ms: Spread | None = None
    e2el_ms: Spread | None = None
    percentiles: tuple[float, ...] = REPORTED_PERCENTILES
    input_tokens: int = 0  # prompt tokens over all requests, as the client counted them
    good: int | None = None  # requests meeting every --goodput SLO; None: no SLO given

    @property
    def per_user(self) -> Spread:
        return spread(self.per_user_rates, slow_tail_low=True, percentiles=self.percentiles)

    @classmethod
    def from_vllm(cls, result: dict[str, Any], counters: SpecCounters = SpecCounters(),
                  percentiles: Sequence[float] = REPORTED_PERCENTILES,
                  slo_ms: Mapping[str, float] | None = None) -> "ServedRun":
        """From the dict vLLM's `bench serve` returns (with --save-detailed, --percentile-metrics ttft,tpot,itl,e2el
        and --metric-percentiles holding `percentiles`), and the difference of the server's counters over it (none
        for a server without a draft); failed requests are refused upstream."""
        lens, latencies = result["output_lens"], result["latencies"]
        rates = tuple(n / t if t else 0.0 for n, t in zip(lens, latencies))
        few = too_few(int(result["completed"]))
        chosen = chosen_percentiles(percentiles)

        def at(name: str, q: float) -> float | None:
            return None if q > 50 and few else result[f"{percentile_key(q)}_{name}_ms"]

        def metric(name: str) -> Spread | None:
            if f"mean_{name}_ms" not in result:
                return None
            return Spread(result[f"mean_{name}_ms"], result[f"p50_{name}_ms"], at(name, 99.0),
                          tuple((q, at(name, q)) for q in chosen if q not in REPORTED_PERCENTILES))

        tpot, ttft = metric("tpot"), metric("ttft")
        assert tpot is not None and ttft is not None, "the client is always asked for TPOT and TTFT"
        return cls(int(result["completed"]), float(result["duration"]), int(result["total_output_tokens"]),
                   float(result["output_throughput"]), rates, tpot, ttft,
                   tuple(str(t) for t in result.get("generated_texts") or ()), counters.drafts, counters.draft_tokens,
                   counters.accepted, counters.per_position, metric("itl"), metric("e2el"), chosen,
                   int(result.get("total_input_tokens") or 0), good_requests(result, slo_ms) if slo_ms else None)

    @property
    def goodput(self) -> float | None:
        """Good requests per second over the run (vLLM's request_goodput)."""
        return None if self.good is None else self.good / self.duration_s if self.duration_s else 0.0

    def to_dict(self) -> dict[str, Any]:
        latencies = {f"{name}_ms": spread.to_dict() for name, spread in (("itl", self.itl_ms), ("e2el", self.e2el_ms))
                     if spread is not None}
        return {"completed": self.completed, "duration_s": round(self.duration_s, 3),
                "output_tokens": self.output_tokens, "output_throughput": round(self.output_throughput, 3),
                "per_user_tokens_per_s": self.per_user.to_dict(), "tpot_ms": self.tpot_ms.to_dict(),
                "ttft_ms": self.ttft_ms.to_dict(), **latencies,
                "mean_input_tokens": round(self.input_tokens / self.completed, 1) if self.completed else 0.0,
                **({} if self.good is None else {"good_requests": self.good,
                                                  "request_goodput": round(self.goodput or 0.0, 4)})}


@dataclass(frozen=True)
class BenchRow:
    """One concurrency (and category): the target alone (None: a running server measured without its no-spec
    twin) and with the draft."""

    concurrency: int
    category: str | None
    baseline: ServedRun | None
    speculative: ServedRun
    num_speculative_tokens: int | None = None  # this row's k (None: a report from before k sweeps)
    input_len: int | None = None  # its input-length bucket: random prompts of this many tokens, or a SPEED-Bench
    # throughput subset's nominal length; None: the prompts as they are

    @property
    def series(self) -> tuple[int | None, int | None, str | None]:
        return (self.num_speculative_tokens, self.input_len, self.category)

    @property
    def speed_up(self) -> float | None:
        if self.baseline is None:
            return None
        base = self.baseline.per_user.mean
        return self.speculative.per_user.mean / base if base else 0.0

    @property
    def samples(self) -> int:
        """The requests the speed-up's interval resamples (each served both ways), or the speculative side's."""
        spec = len(self.speculative.per_user_rates)
        return spec if self.baseline is None else min(spec, len(self.baseline.per_user_rates))

    @property
    def speed_up_interval(self) -> Interval | None:
        if self.baseline is None:
            return None
        return paired_ratio_interval(self.speculative.per_user_rates, self.baseline.per_user_rates)

    @property
    def throughput_speed_up(self) -> float | None:
        if self.baseline is None:
            return None
        base = self.baseline.output_throughput
        return self.speculative.output_throughput / base if base else 0.0

    @property
    def acceptance_length(self) -> float | None:
        spec = self.speculative
        return 1.0 + spec.accepted / spec.drafts if spec.drafts else None

    @property
    def identical_outputs(self) -> int | None:
        """Requests whose text is the same with and without the draft (greedy: all, unless batching changed the
        engine's rounding; sampled: only by chance)."""
        if self.baseline is None:
            return None
        return sum(a == b for a, b in zip(self.baseline.texts, self.speculative.texts))

    def to_dict(self) -> dict[str, Any]:
        interval = self.speed_up_interval
        spec = self.speculative
        speed_up, throughput = self.speed_up, self.throughput_speed_up
        return {"concurrency": self.concurrency, "category": self.category,
                "num_speculative_tokens": self.num_speculative_tokens, "input_len": self.input_len,
                "speed_up": None if speed_up is None else round(speed_up, 4),
                "speed_up_interval": interval.to_dict() if interval else None,
                "throughput_speed_up": None if throughput is None else round(throughput, 4),
                "acceptance_length": self.acceptance_length, "per_position_acceptance": list(spec.per_position),
                "num_drafts": spec.drafts, "num_draft_tokens": spec.draft_tokens, "num_accepted_tokens": spec.accepted,
                "identical_outputs": self.identical_outputs, "requests": len(spec.per_user_rates),
                **sample_marker(self.samples),
                "baseline": None if self.baseline is None else self.baseline.to_dict(), "speculative": spec.to_dict()}


Series = tuple[int | None, int | None, str | None]
"""(k, input-length bucket, category): the rows one verdict judges."""


@dataclass(frozen=True)
class Verdict:
    category: str | None
    pays_at: tuple[int, ...]  # speed-up above 1, its whole interval too
    unresolved_at: tuple[int, ...]  # the interval holds 1: this run cannot say
    loses_at: tuple[int, ...]  # speed-up at most 1, its whole interval too
    stops_paying_at: int | None  # the lowest concurrency measured where it is not shown to pay
    text: str
    num_speculative_tokens: int | None = None
    input_len: int | None = None

    @property
    def series(self) -> Series:
        return (self.num_speculative_tokens, self.input_len, self.category)

    def to_dict(self) -> dict[str, Any]:
        return {"category": self.category, "num_speculative_tokens": self.num_speculative_tokens,
                "input_len": self.input_len, "pays_at": list(self.pays_at), "unresolved_at": list(self.unresolved_at),
                "loses_at": list(self.loses_at), "stops_paying_at": self.stops_paying_at, "text": self.text}


@dataclass(frozen=True)
class RowFigures:
    """The figures of a row a saved report records that its verdict follows from: what `verdict` judges again
    when a report is read back (push --bench), so that no report's own verdict text reaches a card."""

    concurrency: int
    category: str | None
    speed_up: float
    speed_up_interval: Interval | None
    samples: int
    num_speculative_tokens: int | None = None
    input_len: int | None = None

    @property
    def series(self) -> Series:
        return (self.num_speculative_tokens, self.input_len, self.category)

    @classmethod
    def from_dict(cls, row: Mapping[str, Any]) -> "RowFigures":
        interval = row.get("speed_up_interval")
        samples = row.get("samples", row.get("requests"))
        return cls(row["concurrency"], row.get("category"), float(row["speed_up"]),
                   Interval(float(interval["low"]), float(interval["high"])) if isinstance(interval, Mapping) else None,
                   samples if type(samples) is int else MIN_SAMPLES, row.get("num_speculative_tokens"),
                   row.get("input_len"))


def outcome(row: BenchRow | RowFigures) -> str:
    """pays, loses or unresolved: the speed-up's side of 1, and whether its interval stays there; unresolved below
    MIN_SAMPLES requests, where no interval is estimated."""
    if too_few(row.samples) or row.speed_up is None:
        return "unresolved"
    interval = row.speed_up_interval
    if row.speed_up > PAYS and (interval is None or interval.low > PAYS):
        return "pays"
    if row.speed_up <= PAYS and (interval is None or interval.high <= PAYS):
        return "loses"
    return "unresolved"


def series_label(series: Series, show_k: bool = True) -> str:
    """How a verdict names its series: "k=3, 1,024 input tokens, coding" (the parts a report has; k only where
    `show_k`, as a report of one k needs no name for it)."""
    k, input_len, category = series
    return ", ".join(part for part in (f"k={k}" if k is not None and show_k else "",
                                       f"{input_len:,} input tokens" if input_len is not None else "",
                                       category or "") if part)


def verdict(rows: Sequence[BenchRow | RowFigures], category: str | None = None,
            series: Series | None = None, show_k: bool = False) -> Verdict:
    """Where speculation pays, where this run cannot tell, where it loses, and the lowest concurrency where it
    stops being shown to pay: over the rows of one series (`series`, else every row of `category`)."""
    mine = sorted((r for r in rows if (r.series == series if series is not None else r.category == category)),
                  key=lambda r: r.concurrency)
    if series is not None:
        category = series[2]
    outcomes = [(r, outcome(r)) for r in mine]
    pays, unresolved, loses = (tuple(r.concurrency for r, o in outcomes if o == kind)
                               for kind in ("pays", "unresolved", "loses"))
    stops = next((r.concurrency for r, o in outcomes if o != "pays"), None)
    label = series_label(series, show_k) if series is not None else category
    where = f"{label}: " if label else ""

    def figures(kind: str) -> str:
        shown = []
        for r, o in outcomes:
            if o == kind:
                iv = r.speed_up_interval
                spread = (f" {too_few_text(r.samples)}" if too_few(r.samples)
                          else f" [{iv.low:.2f}, {iv.high:.2f}]" if iv else "")
                shown.append(f"C={r.concurrency} x{r.speed_up or 0:.2f}{spread}")
        return ", ".join(shown)

    held = any(o == "unresolved" and not too_few(r.samples) for r, o in outcomes)
    parts = [f"pays at {figures('pays')}" if pays else "",
             f"not resolved at {figures('unresolved')}" + (" (the interval holds 1)" if held else "")
             if unresolved else "",
             f"loses at {figures('loses')}" if loses else ""]
    if not mine:
        text = f"{where}nothing measured"
    else:
        ending = ("; it pays at every concurrency measured" if stops is None
                  else f"; it stops being shown to pay at C={stops}")
        text = f"{where}speculation " + "; ".join(p for p in parts if p) + ending
    k, input_len = (series[0], series[1]) if series is not None else (None, None)
    return Verdict(category, pays, unresolved, loses, stops, text, k, input_len)


def categories(rows: Sequence[BenchRow | RowFigures]) -> list[str | None]:
    """The categories the rows name, in the order they first do (None: the whole prompt set)."""
    seen: list[str | None] = []
    for row in rows:
        if row.category not in seen:
            seen.append(row.category)
    return seen


def verdicts(rows: Sequence[BenchRow | RowFigures]) -> list[Verdict]:
    """One verdict per series (k, input-length bucket, category), in the order the rows first name them."""
    seen: list[Series] = []
    for row in rows:
        if row.series not in seen:
            seen.append(row.series)
    swept = len({series[0] for series in seen}) > 1
    return [verdict(rows, series=series, show_k=swept) for series in seen]


@dataclass
class BenchReport:
    draft: str
    target: str
    eagle_version: str | None
    num_speculative_tokens: int
    max_new_tokens: int
    dtype: str | None  # None: a server eaglekit did not start (--base-url)
    prompts: dict[str, Any]
    engine: dict[str, Any]  # name, version, device, server settings of both runs
    speculative_config: dict[str, Any]
    measured: dict[str, Any] | None  # the draft files' hashes and the target's identity (push --bench binds to
    # them); None for a running server (--base-url), whose files eaglekit cannot see
    rows: list[BenchRow] = field(default_factory=list)
    timings: dict[str, float] = field(default_factory=dict)
    sampling: Sampling = Sampling()  # what every request asked the server for
    request_rate: float = math.inf  # requests/s the client sends (inf: all at once, --max-concurrency bounding them)
    percentiles: tuple[float, ...] = REPORTED_PERCENTILES
    servers: dict[str, Any] = field(default_factory=lambda: {"started_by_eaglekit": True})
    notes: list[str] = field(default_factory=list)
    acceptance_settings: dict[str, Any] = field(default_factory=lambda: settings_block({}))
    """The rule vLLM's counters counted acceptance under (eaglekit.engines.vllm.acceptance_settings)."""
    swept: tuple[int, ...] = ()  # every k served (one server each); num_speculative_tokens is the largest
    seed: int = 0  # the prompts' order and vLLM's client's (random prompts, arrival times)
    burstiness: float = 1.0  # the gamma shape of the arrivals at --request-rate (1: Poisson)
    goodput: dict[str, float] | None = None  # the SLOs in ms good requests meet (--goodput)

    @property
    def categories(self) -> list[str | None]:
        return categories(self.rows)

    @property
    def has_baseline(self) -> bool:
        return all(r.baseline is not None for r in self.rows)

    @property
    def verdicts(self) -> list[Verdict]:
        """Where speculation pays; none without a baseline to compare with."""
        return verdicts(self.rows) if self.has_baseline else []

    def to_dict(self) -> dict[str, Any]:
        from eaglekit import __version__

        return {"schema_version": SCHEMA_VERSION, "eaglekit_version": __version__, "draft": self.draft,
                "target": self.target,
                "eagle_version": self.eagle_version, "num_speculative_tokens": self.num_speculative_tokens,
                "max_new_tokens": self.max_new_tokens, "dtype": self.dtype,
                "sampling": "greedy" if self.sampling.greedy else {"temperature": self.sampling.temperature,
                                                                   "top_p": self.sampling.top_p},
                "prompts": self.prompts, "engine": self.engine, "speculative_config": self.speculative_config,
                "acceptance_settings": self.acceptance_settings,
                "measured": self.measured, "rows": [r.to_dict() for r in self.rows],
                "verdicts": [v.to_dict() for v in self.verdicts],
                "timings": {k: round(v, 3) for k, v in self.timings.items()},
                "request_rate": "inf" if math.isinf(self.request_rate) else self.request_rate,
                "percentiles": [int(q) if int(q) == q else q for q in self.percentiles], "servers": self.servers,
                "notes": self.notes, "num_speculative_tokens_swept": list(self.swept or (self.num_speculative_tokens,)),
                "seed": self.seed, "burstiness": "inf" if math.isinf(self.burstiness) else self.burstiness,
                "goodput": self.goodput}
