"""Publish a draft to the Hub: validate for vLLM, then one commit with the weights, config, card and eaglekit.json.

One commit keeps the card and the weights in agreement. Files are committed from their place in the draft
directory (huggingface_hub streams them from disk); the generated README.md and eaglekit.json are committed from
memory, so the draft directory is never written to. Only an allow-list is uploaded, never stray files.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import logging
import os
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from eaglekit import __version__
from eaglekit.bench.report import RowFigures, Verdict, verdicts
from eaglekit.config_view import REPO_ID, nested
from eaglekit.engines import RECORDS
from eaglekit.errors import CheckpointError, EaglekitError, UsageError, quoted
from eaglekit.families import load_draft
from eaglekit.findings import Finding
from eaglekit.hub.card import build_card, is_repo_id, provenance, recorded_target
from eaglekit.io.checkpoint import INDEX_NAME
from eaglekit.io.hub_client import (
    HubFetchError,
    bounded_hub_client,
    check_endpoint,
    hub_snapshot,
    transport_errors,
    without_credentials,
)
from eaglekit.io.jsonfile import finite, load_json_object
from eaglekit.provenance import finetune_without_gain, untrained_warm_start
from eaglekit.redact import public_report, remember_secret
from eaglekit.serving import minimum_versions
from eaglekit.spec import DraftSpec

if TYPE_CHECKING:
    from eaglekit.rules import ValidationReport

log = logging.getLogger(__name__)

HUB_ENDPOINTS = ("https://huggingface.co", "https://hub-ci.huggingface.co")  # speak xet; other servers may not
MANIFEST_NAME = "eaglekit.json"
VERIFY_FIELDS = (
    "lossless", "acceptance_length", "per_position_acceptance", "num_speculative_tokens",
    "tokens_per_s_spec", "tokens_per_s_target", "prompts", "dtype", "device", "measured",
)
BENCH_FIELDS = ("engine", "dtype", "num_speculative_tokens", "max_new_tokens", "prompts", "rows", "verdicts",
                "measured")
# huggingface_hub retries preupload, LFS batch and LFS PUT itself, but not create_repo or the commit POST.
TRANSIENT_STATUSES = (429, 500, 502, 503, 504)
COMMIT_ATTEMPTS = 3
RETRY_BACKOFF_S = 1.0

Validator = Callable[[DraftSpec], Any]
PUSH_ENGINE = "vllm"  # the engine whose rules, with the engine-neutral ones, decide a push


@dataclass(frozen=True)
class PushedFile:
    path: str  # path in the repo
    size: int
    sha256: str


@dataclass
class PushResult:
    repo_id: str
    endpoint: str
    revision: str | None
    create_pr: bool
    private: bool
    dry_run: bool
    forced: bool  # pushed although validation found errors
    validated: bool  # False when no rules engine was available
    url: str  # the repo page
    commit_url: str | None
    commit_oid: str | None
    pr_url: str | None
    files: list[PushedFile]
    card: str
    findings: list[Finding]
    warnings: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["files"] = [asdict(f) for f in self.files]
        data["findings"] = [f.to_dict() for f in self.findings]
        return data


@dataclass(frozen=True)
class VerifyReportFile:
    """A verify report read for the card, and the file it came from (what every message about it names)."""

    path: str
    doc: dict[str, Any]


@dataclass(frozen=True)
class PushTarget:
    """The target a push declares: the Hub id its card names, and the config.json and weights fingerprint of the
    local folder given as --target (a verify report that measured that folder recorded both)."""

    repo_id: str | None
    config: str | None
    weights: str | None = None


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


def load_report(path: str) -> VerifyReportFile:
    """Read a verify report JSON for the card; figures no decode can produce are refused (one line naming it)."""
    report = load_json_object(path, "verify report")
    for verdict in VERDICTS:
        if verdict in report and not isinstance(report[verdict], bool):
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
            problem = contradicting_verdicts(figures) or impossible_figures(figures, k)
            if problem:
                raise CheckpointError(problem, path)
    return VerifyReportFile(path, report)


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
        if (level, category) in seen:
            raise CheckpointError(f"concurrency {level} is measured twice{f' for {category}' if category else ''}",
                                  path)
        seen.add((level, category))
        for key in BENCH_FIGURES:
            if not (finite(row.get(key)) and row[key] >= 0):
                raise CheckpointError(f"concurrency {level}: {key} must be a finite non-negative number, not "
                                      f"{quoted(row.get(key))}", path)
        interval = row.get("speed_up_interval")
        if interval is not None and not (isinstance(interval, Mapping) and finite(interval.get("low"))
                                         and finite(interval.get("high"))):
            raise CheckpointError(f"concurrency {level}: speed_up_interval must hold finite low and high", path)
        problem = impossible_figures(row, k) or impossible_speeds(row)
        if problem:
            raise CheckpointError(f"concurrency {level}{f' ({category})' if category else ''}: {problem}", path)
    problem = contradicted_verdicts(report)
    if problem:
        raise CheckpointError(problem, path)
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
    judged = {v.category: v.to_dict() for v in bench_verdicts(report["rows"])}
    for given in recorded:
        category = given.get("category")
        mine = judged.get(category)
        where = f" for {category}" if category else ""
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
        if k is not None and len(rates) != k:
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


def push(
    draft_dir: str,
    repo_id: str,
    *,
    target: str | None = None,
    target_id: str | None = None,
    report: VerifyReportFile | None = None,
    bench: VerifyReportFile | None = None,
    private: bool = False,
    revision: str | None = None,
    create_pr: bool = False,
    commit_message: str | None = None,
    token: str | None = None,
    endpoint: str | None = None,
    dry_run: bool = False,
    force: bool = False,
    validate: Validator | None = None,
    license: str | None = None,
    license_link: str | None = None,
) -> PushResult:
    """Validate `draft_dir` for vLLM and publish it as `repo_id`; `dry_run` builds everything but sends nothing.

    `target`: a Hub id, or a local target folder (`target_id`, else its config's Hub id names it in the card).
    `validate(spec)` returns a report with `.findings` or a list of findings; by default eaglekit's vLLM rules run.
    An error finding, or a report that measured other files or another target, refuses the push unless `force`.
    `bench`: an `eaglekit bench` report, the card's serving-speed section (bound to the files as a verify report is).
    """
    from huggingface_hub import constants

    remember_secret(token)
    check_repo_id(repo_id)
    endpoint = check_endpoint(endpoint, "--endpoint") if endpoint else check_endpoint(constants.ENDPOINT,
                                                                                      "HF_ENDPOINT")
    if not os.path.isdir(draft_dir):
        raise CheckpointError("not a draft directory", draft_dir)
    spec = load_draft(draft_dir)
    findings, validated, rules = _run_validation(spec, validate)
    errors = [f for f in findings if f.severity == "error"]
    if errors and not force:
        first = errors[0]
        raise EaglekitError(
            f"refusing to push: validation found {len(errors)} error(s) for vLLM, first {first.code}: {first.message} "
            "(fix them, or pass --force to publish anyway)",
            draft_dir,
        )
    warm_start = untrained_warm_start(spec.config)
    if warm_start and not force:
        raise EaglekitError(f"refusing to push an untrained warm start ({warm_start}): it accepts fewer tokens than "
                            "its source; run `eaglekit finetune DRAFT OUT --target TARGET` first, or pass --force "
                            "(the card then says so)", draft_dir)
    worse = finetune_without_gain(spec.config)
    if worse and not force:
        raise EaglekitError(f"refusing to push a draft its finetune did not measure better than its source ({worse}); "
                            "pass --force to publish it anyway", draft_dir)
    declared = declared_target(target, spec, target_id)
    target = declared.repo_id
    unbound = report_mismatches(report.doc, spec, declared, endpoint=endpoint, token=token) if report else []
    if report is not None and unbound and not force:
        raise EaglekitError(f"refusing this verify report: {unbound[0]} (rerun `eaglekit verify`, or pass --force: "
                            "the card then says so)", report.path)
    bench_unbound = report_mismatches(bench.doc, spec, declared, endpoint=endpoint, token=token) if bench else []
    if bench is not None and bench_unbound and not force:
        raise EaglekitError(f"refusing this bench report: {bench_unbound[0]} (rerun `eaglekit bench`, or pass "
                            "--force: the card then says so)", bench.path)
    forced = bool(errors) or bool(warm_start) or bool(worse) or bool(unbound) or bool(bench_unbound)
    warnings = []
    if not target:
        unnamed = "no target model known" if declared.config is None else "the --target folder records no Hub id"
        warnings.append(f"{unnamed}: pass the target's Hub id as --target so the card's serve commands name it")
    if license_link and license != "other":
        raise UsageError("--license-link names a licence of its own: use it with --license other")
    if not license:
        warnings.append("no --license: the card states none (a draft trained on a target's outputs usually "
                        "carries the target's licence)")
    figures = report.doc if report is not None else None
    speed = bench.doc if bench is not None else None
    card = build_card(spec, repo_id, target=target, report=figures, findings=findings, validated=validated,
                      forced=forced, report_mismatches=unbound, license=license, license_link=license_link,
                      rules=rules, bench=speed, bench_mismatches=bench_unbound)
    manifest = _manifest(spec, target, figures, findings, validated, forced, speed)
    sources = _upload_sources(spec, card, manifest)
    shown = without_credentials(endpoint)
    result = PushResult(
        repo_id=repo_id, endpoint=shown, revision=revision, create_pr=create_pr, private=private,
        dry_run=dry_run, forced=forced, validated=validated, url=f"{shown}/{repo_id}", commit_url=None,
        commit_oid=None, pr_url=None, files=[], card=card, findings=findings, warnings=warnings,
    )
    if dry_run:
        result.files = [_describe(path, source) for path, source in sources]
        return result
    version = "EAGLE-3.1" if spec.eagle_version == "3.1" else "EAGLE-3"
    message = commit_message or f"Upload {version} draft (eaglekit {__version__})"
    _upload(result, endpoint, sources, message, _resolve_token(token))
    return result


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
        return PushTarget(name if is_repo_id(name) else None, config, weights_fingerprint(target_weight_files(config)))
    if value and not REPO_ID.match(value):
        raise UsageError(f"--target {quoted(value)} is neither a Hub id (ORG/NAME) nor an existing folder")
    if value and hub_id and value != hub_id:
        raise UsageError(f"--target {quoted(value)} and --target-id {quoted(hub_id)} name two different Hub models")
    return PushTarget(value or hub_id or recorded_target(spec), None)


def _hub_config(repo_id: str, endpoint: str, token: str | None) -> str | None:
    """The Hub id's config.json: from the local Hugging Face cache, else fetched from the push's endpoint (a few
    KB, after one quiet probe); None when neither works (offline, gated, unknown or unreachable)."""
    try:
        folder = hub_snapshot(repo_id, ["config.json"], endpoint=endpoint, token=token, probe="config.json")
    except HubFetchError:
        return None
    config = os.path.join(folder, "config.json")
    return config if os.path.isfile(config) else None


def report_mismatches(report: Mapping[str, Any], spec: DraftSpec, target: PushTarget, *,
                      endpoint: str = HUB_ENDPOINTS[0], token: str | None = None) -> list[str]:
    """Why a verify report does not describe the files being pushed, or the target this push declares; empty: it
    does. The target is compared as the report records it: by config.json hash and weights fingerprint with a
    local --target folder, by Hub id, and a local copy of unrecorded origin by hash with the Hub id's config.json
    (fetched from `endpoint` when not cached)."""
    from eaglekit.provenance import hash_files, sha256_file, source_files

    measured = report.get("measured")
    if not isinstance(measured, Mapping) or not isinstance(measured.get("draft_files"), Mapping):
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
        elif recorded["weights_fingerprint"] != target.weights:
            problems.append(f"it was measured against a target whose weights are not the ones in {where}")
    elif target.repo_id and is_repo_id(origin):
        if origin != target.repo_id:
            problems.append(f"it was measured against {origin}, not {target.repo_id}")
    elif target.repo_id:
        config = _hub_config(target.repo_id, endpoint, token)
        if config is None:
            problems.append(f"it measured a local target (folder {folder}) that cannot be compared with "
                            f"{target.repo_id}: its config.json is neither cached nor reachable (give that folder as "
                            "--target)")
        elif digest != sha256_file(config):
            problems.append(f"it was measured against a local target (folder {folder}) whose config.json is not "
                            f"{target.repo_id}'s")
    return problems


def check_repo_id(repo_id: str) -> None:
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    try:
        validate_repo_id(repo_id)
    except HFValidationError:
        raise UsageError(f"invalid repo id {quoted(repo_id)}: expected ORG/NAME") from None
    if "/" not in repo_id:
        raise UsageError(f"invalid repo id {quoted(repo_id)}: expected ORG/NAME")


def _run_validation(spec: DraftSpec, validate: Validator | None) -> tuple[list[Finding], bool, ValidationReport | None]:
    """The findings that decide the push (vLLM's and the engine-neutral ones), whether rules ran, and the one rules
    run over every engine that they and the card's serving sections are views of (None with a caller's validator)."""
    if validate is None:
        try:
            from eaglekit.rules import all_rules, run_rules
        except ImportError:
            return [], False, None
        report = run_rules(spec, engine="all")
        other_engines = {r.code for r in all_rules() if r.engine not in (None, PUSH_ENGINE)}
        return [f for f in report.findings if f.code not in other_engines], True, report
    outcome = validate(spec)
    findings = getattr(outcome, "findings", outcome)
    return list(findings or []), True, None


def _manifest(
    spec: DraftSpec,
    target: str | None,
    report: Mapping[str, Any] | None,
    findings: list[Finding],
    validated: bool,
    forced: bool,
    bench: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """eaglekit.json: what was published, from what, and how it checked out; machine-readable twin of the card."""
    g = spec.geometry
    return public_report({
        "eaglekit_version": __version__,
        "target": target,
        "draft": {
            "family": spec.family,
            "producer": spec.producer,
            "eagle_version": spec.eagle_version,
            "architectures": spec.architectures,
            "model_type": spec.model_type,
            "attention": spec.attention,
            "config_layout": spec.config_layout,
            "hidden_size": g.hidden_size,
            "target_hidden_size": g.target_hidden_size,
            "num_layers": g.num_layers,
            "num_aux_hidden_states": spec.num_aux_hidden_states,
            "aux_layer_ids": list(spec.aux.ids) if spec.aux.ids is not None else None,
            "aux_layer_ids_convention": "vLLM: input of layer i (HF hidden_states index)",
            "vocab_size": spec.vocab.vocab_size,
            "draft_vocab_size": spec.vocab.draft_vocab_size,
            "flags": asdict(spec.flags),
            "lm_head": "own" if spec.has_lm_head else "target",
            "embed_tokens": "own" if spec.has_embed_tokens else "target",
            "dtype": spec.dtype,
            "num_parameters": spec.num_parameters,
        },
        "engines": {RECORDS[engine].label: {"min_version": need.version,
                                     "why": "; ".join(need.reasons) or "relies on no feature newer than EAGLE-3"}
                    for engine, need in minimum_versions(spec).items()},
        "provenance": provenance(spec) or None,
        "validation": {
            "engine": "vllm",
            "ran": validated,
            "errors": sum(f.severity == "error" for f in findings),
            "warnings": sum(f.severity == "warning" for f in findings),
            "forced": forced,
            "findings": [f.to_dict() for f in findings],
        },
        "verify": {k: report[k] for k in VERIFY_FIELDS if k in report} if report else None,
        "bench": {k: bench.get(k) for k in BENCH_FIELDS} if bench else None,
    })


def _upload_sources(spec: DraftSpec, card: str, manifest: dict[str, Any]) -> list[tuple[str, str | bytes]]:
    """(path in repo, local file or generated bytes) for exactly the allow-listed files."""
    root = spec.path
    names = ["config.json"]
    if os.path.isfile(os.path.join(root, INDEX_NAME)):
        names.append(INDEX_NAME)
    names += sorted(spec.files)
    sources: list[tuple[str, str | bytes]] = [(name, os.path.join(root, name)) for name in names]
    sources.append(("README.md", card.encode()))
    sources.append((MANIFEST_NAME, (json.dumps(manifest, indent=2) + "\n").encode()))
    return sources


def _describe(path: str, source: str | bytes) -> PushedFile:
    if isinstance(source, bytes):
        return PushedFile(path, len(source), hashlib.sha256(source).hexdigest())
    digest = hashlib.sha256()
    with open(source, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    return PushedFile(path, os.path.getsize(source), digest.hexdigest())


def _resolve_token(token: str | None) -> str:
    from huggingface_hub import get_token

    token = token or get_token()
    if not token:
        raise EaglekitError("no Hugging Face token: pass --token, set HF_TOKEN, or run `hf auth login`")
    return token


def _upload(result: PushResult, endpoint: str, sources: list[tuple[str, str | bytes]], message: str,
            token: str) -> None:
    """Commit `sources` through `endpoint` (which may carry credentials; `result` shows it without them)."""
    from huggingface_hub import CommitOperationAdd, HfApi

    bounded_hub_client()
    if not sys.stderr.isatty():  # the client's upload bars are for a terminal; in logs they bury the one error line
        from huggingface_hub.utils import disable_progress_bars

        disable_progress_bars()
    api = HfApi(endpoint=endpoint, token=token)
    operations = [CommitOperationAdd(path_in_repo=path, path_or_fileobj=source) for path, source in sources]
    with _hub_errors(result.endpoint, result.repo_id, result.revision), _lfs_unless_hub(result):
        repo_url = _retry_transient(lambda: api.create_repo(result.repo_id, private=result.private, exist_ok=True))
        result.url = without_credentials(str(repo_url))
        if result.revision and result.revision != "main" and not result.create_pr:
            api.create_branch(result.repo_id, branch=result.revision, exist_ok=True)
        info = _retry_transient(lambda: api.create_commit(
            result.repo_id, operations, commit_message=message, revision=result.revision, create_pr=result.create_pr,
        ))
    result.commit_url, result.commit_oid = without_credentials(info.commit_url), info.oid
    result.pr_url = without_credentials(info.pr_url) if info.pr_url else None
    result.files = [PushedFile(op.path_in_repo, op.upload_info.size, op.upload_info.sha256.hex()) for op in operations]


def _retry_transient(call: Callable[[], Any]) -> Any:
    """Retry a call whose failing request huggingface_hub does not retry itself, on transient statuses."""
    from huggingface_hub.errors import HfHubHTTPError

    for attempt in range(1, COMMIT_ATTEMPTS + 1):
        try:
            return call()
        except HfHubHTTPError as exc:
            status = _status(exc)
            if status not in TRANSIENT_STATUSES or _retried_by_client(exc) or attempt == COMMIT_ATTEMPTS:
                raise
            log.warning("HTTP %s from the Hub; retrying (%d/%d)", status, attempt, COMMIT_ATTEMPTS - 1)
            time.sleep(RETRY_BACKOFF_S * attempt)
    raise AssertionError("unreachable")


def _status(exc: Exception) -> int | None:
    response = getattr(exc, "response", None)
    return getattr(response, "status_code", None)


def _retried_by_client(exc: Exception) -> bool:
    """Preupload, LFS batch and LFS uploads already went through huggingface_hub's own backoff."""
    request = getattr(getattr(exc, "response", None), "request", None)
    if request is None:
        return False
    path = request.url.path
    return request.method == "PUT" or "/preupload/" in path or "/info/lfs/" in path


@contextmanager
def _lfs_unless_hub(result: PushResult) -> Iterator[None]:
    """For this call only, upload over plain LFS to endpoints other than the Hub.

    The client does not negotiate xet; against a server without it, an xet upload retries until it times out.
    """
    from huggingface_hub import constants

    xet_on = not constants.HF_HUB_DISABLE_XET and importlib.util.find_spec("hf_xet") is not None
    if result.endpoint in HUB_ENDPOINTS or not xet_on:
        yield
        return
    result.warnings.append(f"{result.endpoint} is not the Hugging Face Hub: uploading over Git LFS instead of xet")
    constants.HF_HUB_DISABLE_XET = True
    try:
        yield
    finally:
        constants.HF_HUB_DISABLE_XET = False


@contextmanager
def _hub_errors(endpoint: str, repo_id: str, revision: str | None) -> Iterator[None]:
    """Turn client exceptions into one-line EaglekitErrors that never include the token."""
    from huggingface_hub.errors import HfHubHTTPError, OfflineModeIsEnabled, RevisionNotFoundError

    connect_error, transport_error = transport_errors()
    try:
        yield
    except OfflineModeIsEnabled:
        raise EaglekitError(f"offline mode is on (HF_HUB_OFFLINE): not pushing to {endpoint}") from None
    except connect_error:
        raise EaglekitError(f"cannot reach {endpoint}") from None
    except transport_error as exc:
        raise EaglekitError(f"cannot reach {endpoint}: {type(exc).__name__}") from None
    except RevisionNotFoundError:
        raise EaglekitError(f"revision {quoted(revision)} does not exist in {repo_id} on {endpoint}") from None
    except HfHubHTTPError as exc:
        status = _status(exc)
        if status in (401, 403):
            raise EaglekitError(f"authentication failed for {endpoint}: check --token / HF_TOKEN") from None
        detail = (exc.server_message or "").strip().splitlines()
        raise EaglekitError(
            f"push to {endpoint} failed: HTTP {status}" + (f" ({detail[0]})" if detail else "")
        ) from None
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        if isinstance(exc, ValueError) and "Invalid metadata in README.md" in str(exc):
            reasons = " ".join(line.strip("- ") for line in str(exc).splitlines()[1:])
            raise EaglekitError(f"{endpoint} rejected the model card metadata: {reasons}") from None
        # garbage or wrongly shaped JSON in an answer: the client fails while reading it
        raise EaglekitError(f"push to {endpoint} failed: its answer is not what the Hub sends "
                            f"({type(exc).__name__})") from None
