"""The evidence a push publishes: verify and bench reports read for the card, refused when their figures are ones
no decode or engine run can produce, and bound to the files being pushed and the target the push declares.

A card repeats a report's figures as fact, so a report is checked before anything is uploaded: a hand-edited or
stale report is refused with one line naming it rather than published.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from eaglekit.bench.report import RowFigures, Verdict, series_label, verdicts
from eaglekit.config_view import REPO_ID, nested
from eaglekit.decode.sampling import GREEDY_BELOW
from eaglekit.decode.stats import MIN_SAMPLES, too_few
from eaglekit.engines.vllm import not_a_drafters_acceptance
from eaglekit.errors import CheckpointError, EaglekitError, UsageError, quoted
from eaglekit.hub.card import recorded_target
from eaglekit.hub.card_text import is_repo_id
from eaglekit.hub.upload import HUB_ENDPOINTS
from eaglekit.io.hub_client import HubFetchError, hub_snapshot
from eaglekit.io.jsonfile import finite, load_json_object
from eaglekit.spec import DraftSpec


@dataclass(frozen=True)
class VerifyReportFile:
    """A verify report read for the card, and the file it came from (what every message about it names)."""

    path: str
    doc: dict[str, Any]


@dataclass(frozen=True)
class PushTarget:
    """The target a push declares: the Hub id its card names, and the config.json, weights fingerprint and head
    digest of the local folder given as --target (a verify report that measured that folder recorded them)."""

    repo_id: str | None
    config: str | None
    weights: str | None = None
    head: str | None = None


VERDICTS = ("passed", "lossless", "exact_match")
BENCH_FIGURES = ("speed_up", "throughput_speed_up")
RATES = ("per_position_acceptance", "conditional_acceptance")
COUNTERS = ("num_drafts", "num_draft_tokens", "num_accepted_tokens")
FIGURE_TOLERANCE = 1e-6  # a report's figures are one counter's quotients, written with full float precision
SPREADS = ("per_user_tokens_per_s", "tpot_ms", "ttft_ms")
VERDICT_FIELDS = ("pays_at", "unresolved_at", "loses_at", "stops_paying_at")
RATIO_ROUNDING = 0.5e-4  # bench writes speed-ups and per-user means to 4 decimals, throughputs to 3
MEAN_ROUNDING = 0.5e-4
THROUGHPUT_ROUNDING = 0.5e-3


def sampled(report: Mapping[str, Any]) -> bool:
    """A report of a sampled decode (verify --temperature): it leaves lossless and exact_match null, since one draw
    per prompt cannot show the output follows the target's distribution."""
    temperature = nested(report, "sampling").get("temperature")
    return isinstance(temperature, (int, float)) and finite(temperature) and temperature >= GREEDY_BELOW


def load_report(path: str) -> VerifyReportFile:
    """Read a verify report JSON for the card; figures no decode can produce are refused (one line naming it)."""
    report = load_json_object(path, "verify report")
    for verdict in VERDICTS:
        value = report.get(verdict)
        unjudged = value is None and verdict != "passed" and sampled(report)
        if verdict in report and not (isinstance(value, bool) or unjudged):
            raise CheckpointError(f"{verdict} must be true or false, not {quoted(report[verdict])}", path)
    k = report.get("num_speculative_tokens")
    if k is not None and (type(k) is not int or k < 1):
        raise CheckpointError(f"num_speculative_tokens must be a positive integer, not {quoted(k)}", path)
    for key in ("tokens_per_s_spec", "tokens_per_s_target"):
        if report.get(key) is not None and not (finite(report[key]) and report[key] >= 0):
            raise CheckpointError(f"{key} must be a finite non-negative number, not {quoted(report[key])}", path)
    conditions = report.get("conditions")
    for figures in [report] + (conditions if isinstance(conditions, list) else []):
        if isinstance(figures, Mapping):
            problem = contradicting_verdicts(figures) or impossible_figures(figures, k) or impossible_intervals(figures)
            if problem:
                raise CheckpointError(problem, path)
    refuse_not_a_drafters_acceptance(report, path)
    return VerifyReportFile(path, report)


def refuse_not_a_drafters_acceptance(report: Mapping[str, Any], path: str) -> None:
    """Refuse a report whose acceptance was counted under a rule that does not measure the draft (vLLM's lossy FLy
    or its synthetic sampler): a card would state that τ as the draft's. Every place a report records the rule is
    read: its own settings, its engine's, a bench report's speculative config, each condition's."""
    engine = report.get("engine")
    conditions = report.get("conditions")
    blocks = [report.get("acceptance_settings"), report.get("speculative_config"),
              engine.get("acceptance_settings") if isinstance(engine, Mapping) else None,
              *(c.get("acceptance_settings") for c in (conditions if isinstance(conditions, list) else [])
                if isinstance(c, Mapping))]
    for block in blocks:
        why = not_a_drafters_acceptance(block) if isinstance(block, Mapping) else None
        if why:
            raise CheckpointError(f"{why}: a card states a drafter's acceptance; measure again under "
                                  "rejection_sample_method=standard (vLLM's default)", path)


def load_bench_report(path: str) -> VerifyReportFile:
    """Read a bench report JSON (`eaglekit bench --save-report`) for the card's speed section; a report with no
    measurement, or figures no engine run can produce, is refused (one line naming it)."""
    report = load_json_object(path, "bench report")
    rows = report.get("rows")
    engine = report.get("engine")
    if report.get("schema_version") != "1" or not isinstance(rows, list) or not rows or not isinstance(engine, Mapping):
        raise CheckpointError("not an eaglekit bench report (schema_version \"1\" with engine and rows)", path)
    k = report.get("num_speculative_tokens")
    if type(k) is not int or k < 1:
        raise CheckpointError(f"num_speculative_tokens must be a positive integer, not {quoted(k)}", path)
    seen = set()
    for row in rows:
        if not isinstance(row, Mapping):
            raise CheckpointError("every row must be an object", path)
        level, category = row.get("concurrency"), row.get("category")
        if type(level) is not int or level < 1:
            raise CheckpointError(f"concurrency must be a positive integer, not {quoted(level)}", path)
        row_k = row.get("num_speculative_tokens")
        row_k = k if row_k is None else row_k  # a single-k report's rows name no k of their own
        if type(row_k) is not int or not 1 <= row_k <= k:
            raise CheckpointError(f"concurrency {level}: num_speculative_tokens must be a positive integer up to the "
                                  f"report's {k}, not {quoted(row_k)}", path)
        series = (row_k, row.get("input_len"), category)
        if (level, series) in seen:
            raise CheckpointError(f"concurrency {level} is measured twice for {series_label(series) or 'one series'}",
                                  path)
        seen.add((level, series))
        if "baseline" in row and row["baseline"] is None and row.get("speed_up") is None:
            raise CheckpointError(f"concurrency {level}: no baseline was measured (bench --base-url without "
                                  "--baseline-url), so there is no speed-up to put on a card", path)
        for key in BENCH_FIGURES:
            if not (finite(row.get(key)) and row[key] >= 0):
                raise CheckpointError(f"concurrency {level}: {key} must be a finite non-negative number, not "
                                      f"{quoted(row.get(key))}", path)
        interval = row.get("speed_up_interval")
        if interval is not None and not (isinstance(interval, Mapping) and finite(interval.get("low"))
                                         and finite(interval.get("high"))):
            raise CheckpointError(f"concurrency {level}: speed_up_interval must hold finite low and high", path)
        problem = impossible_figures(row, row_k) or impossible_speeds(row)
        if problem:
            raise CheckpointError(f"concurrency {level}{f' ({category})' if category else ''}: {problem}", path)
    problem = contradicted_verdicts(report)
    if problem:
        raise CheckpointError(problem, path)
    refuse_not_a_drafters_acceptance(report, path)
    return VerifyReportFile(path, {**report, "verdicts": [v.to_dict() for v in bench_verdicts(report["rows"])]})


def impossible_speeds(row: Mapping[str, Any]) -> str | None:
    """Why a bench row's speeds cannot come from one measurement; None when they can. Rates, times and counts are
    not negative, a speed-up is the ratio of the means beside it (within the report's rounding), and its interval
    runs from low to high around it."""
    sides = {}
    for side in ("baseline", "speculative"):
        figures = row.get(side)
        if not isinstance(figures, Mapping):
            return f"{side} must be an object with the figures of that run"
        for key in SPREADS:
            spread = figures.get(key)
            if not isinstance(spread, Mapping):
                return f"{side}.{key} must hold mean, p50 and p99"
            for stat in ("mean", "p50", "p99"):
                if stat == "p99" and spread.get(stat) is None and row.get("too_few_samples") is True:
                    continue  # below the floor bench estimates no tail
                if not (finite(spread.get(stat)) and spread[stat] >= 0):
                    return f"{side}.{key}.{stat} must be a finite non-negative number, not {quoted(spread.get(stat))}"
        for key in ("duration_s", "output_throughput"):
            if not (finite(figures.get(key)) and figures[key] >= 0):
                return f"{side}.{key} must be a finite non-negative number, not {quoted(figures.get(key))}"
        sides[side] = figures
    for key, mean, rounding in (("speed_up", ("per_user_tokens_per_s", "mean"), MEAN_ROUNDING),
                                ("throughput_speed_up", ("output_throughput",), THROUGHPUT_ROUNDING)):
        base, spec = (_figure(sides[side], mean) for side in ("baseline", "speculative"))
        if not _ratio_within_rounding(row[key], spec, base, rounding):
            return (f"{key} {row[key]} is not the ratio of the means beside it ({spec} / {base} with the draft and "
                    "without)")
    interval = row.get("speed_up_interval")
    if isinstance(interval, Mapping):
        low, high = interval["low"], interval["high"]
        if low < 0 or low > high + RATIO_ROUNDING:
            return f"speed_up_interval runs from {low} to {high}: its low must be non-negative and below its high"
        if not low - RATIO_ROUNDING <= row["speed_up"] <= high + RATIO_ROUNDING:
            return f"speed_up_interval [{low}, {high}] excludes its own estimate {row['speed_up']}"
    return None


def few_sample_figures(bench: Mapping[str, Any]) -> list[str]:
    """The card figures of a bench report that rest on fewer than MIN_SAMPLES requests (no interval estimated)."""
    found = []
    for row in bench.get("rows") or []:
        samples = row.get("samples", row.get("requests")) if isinstance(row, Mapping) else None
        if type(samples) is int and too_few(samples):
            category = f" ({row['category']})" if row.get("category") else ""
            found.append(f"the speed-up at concurrency {row['concurrency']}{category} rests on {samples} requests")
    return found


def refuse_few_samples(bench: VerifyReportFile | None, allow: bool) -> None:
    """Refuse a bench report whose card figures are below the sample floor unless `allow` (the card then says
    so): a card states its figures as fact, and two requests resolve nothing."""
    few = few_sample_figures(bench.doc) if bench is not None else []
    if few and bench is not None and not allow:
        raise EaglekitError(f"refusing to put a figure without an interval on the card: {few[0]}, an interval needs "
                            f"{MIN_SAMPLES} (rerun `eaglekit bench` with --limit {MIN_SAMPLES} or more, or pass "
                            "--allow-few-samples: the card then says so)", bench.path)


def _figure(figures: Mapping[str, Any], keys: tuple[str, ...]) -> float:
    value: Any = figures
    for key in keys:
        value = value[key]
    return float(value)


def _ratio_within_rounding(ratio: float, spec: float, base: float, rounding: float) -> bool:
    """Whether `ratio` (rounded to RATIO_ROUNDING) can be spec / base with both rounded to `rounding` (0 for 0)."""
    if base <= rounding:  # bench writes 0 for a run with no throughput; below the rounding any ratio is possible
        return ratio == 0 if base == 0 else ratio >= 0
    low = max(spec - rounding, 0.0) / (base + rounding)
    high = (spec + rounding) / (base - rounding)
    return low - RATIO_ROUNDING <= ratio <= high + RATIO_ROUNDING


def bench_verdicts(rows: list[Mapping[str, Any]]) -> list[Verdict]:
    """The verdicts `eaglekit bench` gives these rows, judged again from their figures: what a card prints."""
    return verdicts([RowFigures.from_dict(row) for row in rows])


def contradicted_verdicts(report: Mapping[str, Any]) -> str | None:
    """Why a bench report's own verdicts are not the ones its rows give; None when they are (or it records none)."""
    recorded = report.get("verdicts")
    if recorded is None:
        return None
    if not isinstance(recorded, list) or not all(isinstance(v, Mapping) for v in recorded):
        return "verdicts must be a list of objects"
    judged = {v.series: v.to_dict() for v in bench_verdicts(report["rows"])}
    for given in recorded:
        series = (given.get("num_speculative_tokens"), given.get("input_len"), given.get("category"))
        mine = judged.get(series)
        label = series_label(series)
        where = f" for {label}" if label else ""
        if mine is None:
            return f"it gives a verdict{where} but measured no row{where}"
        for key in VERDICT_FIELDS:
            if key in given and given[key] != mine[key]:
                return (f"its verdict{where} says {key} {quoted(given[key])}, but its rows give {quoted(mine[key])}: "
                        "the verdict does not follow from the figures")
    return None


def contradicting_verdicts(figures: Mapping[str, Any]) -> str | None:
    """Why a report's verdicts cannot all be true; None when they can. verify passes only a lossless decode, and
    an exact match is lossless."""
    lossless = figures.get("lossless")
    for verdict in ("passed", "exact_match"):
        if figures.get(verdict) is True and lossless is False:
            return f"{verdict} is true but lossless is false: verify never writes that"
    return None


def impossible_figures(figures: Mapping[str, Any], k: int | None) -> str | None:
    """Why these acceptance figures cannot come from a decode with k drafts per round; None when they can.

    τ counts the bonus token, so 1 <= τ <= k + 1; position i is accepted only after every earlier one, so the
    per-position rates never rise and add up to τ - 1; the counters are the same quantities before dividing."""
    tau = figures.get("acceptance_length")
    if tau is not None and not (finite(tau) and tau >= 1):
        return f"acceptance_length must be a number of at least 1 (it counts the bonus token), not {quoted(tau)}"
    if tau is not None and k is not None and tau > k + 1 + FIGURE_TOLERANCE:
        return f"acceptance_length {tau} is more than k + 1 = {k + 1}: a round accepts at most k drafts and a bonus"
    for key in RATES:
        rates = figures.get(key)
        if rates is None:
            continue
        if not (isinstance(rates, list) and all(finite(r) and 0 <= r <= 1 for r in rates)):
            return f"{key} must be a list of rates in [0, 1]"
        unknown = rates == [] and tau is None  # no engine τ: bench found no counters for the row
        if k is not None and len(rates) != k and not unknown:
            return f"{key} lists {len(rates)} draft positions, but num_speculative_tokens is {k}"
    rates = figures.get("per_position_acceptance") or []
    if any(later > earlier + FIGURE_TOLERANCE for earlier, later in zip(rates, rates[1:])):
        return "per_position_acceptance rises along the chain: a draft is accepted only after every earlier one"
    if rates and tau is not None and abs(1 + sum(rates) - tau) > FIGURE_TOLERANCE * len(rates):
        return f"acceptance_length {tau} is not 1 + the sum of per_position_acceptance ({1 + sum(rates):.6g})"
    rate = figures.get("draft_acceptance_rate")
    if rate is not None and not (finite(rate) and 0 <= rate <= 1):
        return f"draft_acceptance_rate must be a rate in [0, 1], not {quoted(rate)}"
    if rate is not None and tau is not None and k is not None and abs(rate * k + 1 - tau) > FIGURE_TOLERANCE * k:
        return f"draft_acceptance_rate {rate} does not match acceptance_length {tau} with k = {k}"
    counts = {key: figures.get(key) for key in COUNTERS if figures.get(key) is not None}
    for key, value in counts.items():
        if type(value) is not int or value < 0:
            return f"{key} must be a non-negative integer, not {quoted(value)}"
    drafts, draft_tokens, accepted = (counts.get(key) for key in COUNTERS)
    if drafts is not None and draft_tokens is not None and k is not None and draft_tokens != drafts * k:
        return f"num_draft_tokens {draft_tokens} is not num_drafts {drafts} x k {k}"
    if accepted is not None and draft_tokens is not None and accepted > draft_tokens:
        return f"num_accepted_tokens {accepted} is more than the {draft_tokens} tokens drafted"
    if drafts is not None and accepted is not None and tau is not None:
        counted = 1 + accepted / drafts if drafts else 1.0
        if abs(counted - tau) > FIGURE_TOLERANCE:
            return f"acceptance_length {tau} does not match its counters (1 + {accepted} accepted / {drafts} rounds)"
    return None


def _ordered(interval: Any) -> bool:
    if not isinstance(interval, Mapping):
        return False
    low: Any = interval.get("low")
    high: Any = interval.get("high")
    return finite(low) and finite(high) and low <= high


def impossible_intervals(figures: Mapping[str, Any]) -> str | None:
    """Why an interval the card would print cannot be one (its low above its high, a rate's outside [0, 1], not one
    per draft position); None when each can."""
    tau = figures.get("acceptance_length_interval")
    if tau is not None and not _ordered(tau):
        return "acceptance_length_interval must have finite bounds, its low at most its high"
    positions = figures.get("per_position_acceptance_interval")
    if positions is None:
        return None
    if not (isinstance(positions, list) and all(_ordered(i) and 0 <= i["low"] and i["high"] <= 1 for i in positions)):
        return "per_position_acceptance_interval must list intervals within [0, 1], each low at most its high"
    rates = figures.get("per_position_acceptance")
    if isinstance(rates, list) and len(positions) != len(rates):
        return (f"per_position_acceptance_interval lists {len(positions)} draft positions, per_position_acceptance "
                f"{len(rates)}")
    return None


def declared_target(value: str | None, spec: DraftSpec, hub_id: str | None = None) -> PushTarget:
    """The target a push declares: --target as a local folder (or its config.json), named on the card by
    --target-id or else by the Hub id its config records, or --target as a Hub id, else the Hub id the draft
    records."""
    from eaglekit.provenance import target_weight_files, weights_fingerprint
    from eaglekit.target import target_config_path

    if hub_id is not None and not REPO_ID.match(hub_id):
        raise UsageError(f"--target-id {quoted(hub_id)} is not a Hub id (ORG/NAME)")
    if value and os.path.exists(value):
        config = target_config_path(value)
        name = hub_id or load_json_object(config, "target config").get("_name_or_path")
        return PushTarget(name if is_repo_id(name) else None, config, weights_fingerprint(target_weight_files(config)),
                          _head_identity(config))
    if value and not REPO_ID.match(value):
        raise UsageError(f"--target {quoted(value)} is neither a Hub id (ORG/NAME) nor an existing folder")
    if value and hub_id and value != hub_id:
        raise UsageError(f"--target {quoted(value)} and --target-id {quoted(hub_id)} name two different Hub models")
    return PushTarget(value or hub_id or recorded_target(spec), None)


def _head_identity(config: str) -> str | None:
    """The head digest of the local target `config` names (eaglekit.provenance.head_identity); None where its
    config or files say of no head: a report that recorded one is then told the weights differ."""
    from eaglekit.provenance import head_identity
    from eaglekit.target import read_target

    try:
        return head_identity(read_target(config, decoder=False))
    except CheckpointError:
        return None


def _hub_config(repo_id: str, endpoint: str, token: str | None, offline: bool = False) -> str | None:
    """The Hub id's config.json: from the local Hugging Face cache, else (unless `offline`) fetched from the push's
    endpoint (a few KB, after one quiet probe); None when neither works (offline, gated, unknown or unreachable)."""
    try:
        folder = hub_snapshot(repo_id, ["config.json"], endpoint=endpoint, token=token, probe="config.json",
                              cache_only=offline)
    except HubFetchError:
        return None
    config = os.path.join(folder, "config.json")
    return config if os.path.isfile(config) else None


def report_mismatches(report: Mapping[str, Any], spec: DraftSpec, target: PushTarget, *,
                      endpoint: str = HUB_ENDPOINTS[0], token: str | None = None,
                      offline: bool = False) -> list[str]:
    """Why a verify report does not describe the files being pushed, or the target this push declares; empty: it
    does. The target is compared as the report records it: by config.json hash, weights fingerprint and head
    digest with a local --target folder, by Hub id, and a local copy of unrecorded origin by hash with the Hub
    id's config.json (fetched from `endpoint` when not cached, unless `offline`)."""
    from eaglekit.provenance import hash_files, sha256_file, source_files

    measured = report.get("measured")
    if not isinstance(measured, Mapping) or not isinstance(measured.get("draft_files"), Mapping):
        servers = report.get("servers")
        if isinstance(servers, Mapping) and servers.get("started_by_eaglekit") is False:
            return ["the report measured a server eaglekit did not start (bench --base-url), whose files it cannot "
                    "see"]
        return ["the report does not record which files it measured (it predates report binding)"]
    ours = hash_files(spec.path, source_files(spec))
    theirs = dict(measured["draft_files"])
    problems = [f"{name} differs from the file the report measured" for name in sorted(ours)
                if name in theirs and theirs[name] != ours[name]]
    problems += [f"the report measured no {name}" for name in sorted(set(ours) - set(theirs))]
    problems += [f"the report measured {quoted(name)}, which is not in the draft"
                 for name in sorted(set(theirs) - set(ours))]
    recorded = nested(measured, "target")
    origin, digest, folder = recorded.get("name_or_path"), recorded.get("config_sha256"), quoted(recorded.get("folder"))
    if target.config:
        where = os.path.dirname(os.path.abspath(target.config))
        if digest != sha256_file(target.config):
            problems.append(f"it was measured against a target whose config.json is not the one in {where}")
        elif not recorded.get("weights_fingerprint"):
            problems.append("the report does not record the target's weights (it predates weight binding)")
        elif (recorded["weights_fingerprint"] != target.weights
              or recorded.get("head_sha256", target.head) != target.head):
            problems.append(f"it was measured against a target whose weights are not the ones in {where}")
    elif target.repo_id and is_repo_id(origin):
        if origin != target.repo_id:
            problems.append(f"it was measured against {origin}, not {target.repo_id}")
    elif target.repo_id:
        config = _hub_config(target.repo_id, endpoint, token, offline)
        if config is None:
            problems.append(f"it measured a local target (folder {folder}) that cannot be compared with "
                            f"{target.repo_id}: its config.json is neither cached nor reachable (give that folder as "
                            "--target)")
        elif digest != sha256_file(config):
            problems.append(f"it was measured against a local target (folder {folder}) whose config.json is not "
                            f"{target.repo_id}'s")
    return problems
