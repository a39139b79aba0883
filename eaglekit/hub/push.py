"""Publish a draft to the Hub: validate for vLLM, then one commit with the weights, config, card and eaglekit.json.

One commit keeps the card and the weights in agreement. Files are committed from their place in the draft
directory (huggingface_hub streams them from disk); the generated README.md and eaglekit.json are committed from
memory, so the draft directory is never written to. Only an allow-list is uploaded, never stray files.
The reports a card cites are checked in eaglekit.hub.evidence; the Hub is spoken to in eaglekit.hub.upload.
"""

from __future__ import annotations

import os
import shlex
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from eaglekit import __version__
from eaglekit.engines import RECORDS
from eaglekit.errors import CheckpointError, EaglekitError, UsageError
from eaglekit.families import load_draft
from eaglekit.findings import Finding
from eaglekit.hub.access import HubAccess, check_access
from eaglekit.hub.attachments import evaluation_files
from eaglekit.hub.card import build_card, provenance, recorded_target
from eaglekit.hub.evidence import (
    PushTarget,
    VerifyReportFile,
    declared_target,
    refuse_few_samples,
    report_mismatches,
)
from eaglekit.hub.upload import (
    PushedFile,
    check_repo_id,
    commit_to_hub,
    describe_file,
    find_token,
    resolve_token,
    upload_sources,
)
from eaglekit.io.urls import check_http_url, without_credentials
from eaglekit.provenance import finetune_without_gain, untrained_warm_start
from eaglekit.redact import public_report, remember_secret
from eaglekit.serving import minimum_versions
from eaglekit.spec import DraftSpec

if TYPE_CHECKING:
    from eaglekit.rules import ValidationReport

VERIFY_FIELDS = (
    "lossless", "acceptance_length", "per_position_acceptance", "num_speculative_tokens",
    "tokens_per_s_spec", "tokens_per_s_target", "prompts", "dtype", "device", "measured", "acceptance_settings",
)
BENCH_FIELDS = ("engine", "dtype", "num_speculative_tokens", "max_new_tokens", "prompts", "rows", "verdicts",
                "measured", "acceptance_settings")

Validator = Callable[[DraftSpec], Any]
PUSH_ENGINE = "vllm"  # the engine whose rules, with the engine-neutral ones, decide a push


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
    hub_check: HubAccess | None = None  # a dry run's question to the Hub: token, write permission, repository

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["files"] = [asdict(f) for f in self.files]
        data["findings"] = [f.to_dict() for f in self.findings]
        data["hub_check"] = self.hub_check.to_dict() if self.hub_check else None
        return data


def push(
    draft_dir: str,
    repo_id: str,
    *,
    target: str | None = None,
    target_id: str | None = None,
    report: VerifyReportFile | None = None,
    bench: VerifyReportFile | None = None,
    plots: Sequence[str] = (),
    private: bool = False,
    revision: str | None = None,
    create_pr: bool = False,
    commit_message: str | None = None,
    token: str | None = None,
    endpoint: str | None = None,
    dry_run: bool = False,
    offline: bool = False,
    force: bool = False,
    allow_few_samples: bool = False,
    validate: Validator | None = None,
    license: str | None = None,
    license_link: str | None = None,
) -> PushResult:
    """Validate `draft_dir` for vLLM and publish it as `repo_id`; `dry_run` builds everything and sends nothing but
    its questions to the Hub (whose token, may it write, does the repository exist), which `offline` leaves out too.

    `target`: a Hub id, or a local target folder (`target_id`, else its config's Hub id names it in the card).
    `validate(spec)` returns a report with `.findings` or a list of findings; by default eaglekit's vLLM rules run.
    An error finding, or a report that measured other files or another target, refuses the push unless `force`.
    `bench`: an `eaglekit bench` report, the card's serving-speed section (bound to the files as a verify report is);
    one with a figure over fewer requests than an interval needs is refused unless `allow_few_samples`.
    The reports (redacted) and `plots` (PNG files eaglekit drew) are uploaded under eval/ and the card links them.
    """
    from huggingface_hub import constants

    remember_secret(token)
    check_repo_id(repo_id)
    if offline and not dry_run:
        raise UsageError("--offline goes with --dry-run: a push needs the Hub")
    endpoint = check_http_url(endpoint or constants.ENDPOINT, "--endpoint" if endpoint else "HF_ENDPOINT",
                              "https://huggingface.co")
    if not os.path.isdir(draft_dir):
        raise CheckpointError("not a draft directory", draft_dir)
    spec = load_draft(draft_dir)
    findings, validated, rules = _run_validation(spec, validate)
    draft_forced = _refuse_unfit_draft(spec, findings, draft_dir, force, target or recorded_target(spec))
    declared = declared_target(target, spec, target_id)
    target = declared.repo_id
    unbound, bench_unbound = _unbound_evidence(report, bench, spec, declared, endpoint, token, force, offline)
    refuse_few_samples(bench, allow_few_samples)
    forced = draft_forced or bool(unbound) or bool(bench_unbound)
    warnings = _publishing_warnings(declared, license, license_link)
    figures = report.doc if report is not None else None
    speed = bench.doc if bench is not None else None
    evaluation = evaluation_files(figures, speed, plots)
    card = build_card(spec, repo_id, target=target, report=figures, findings=findings, validated=validated,
                      forced=forced, report_mismatches=unbound, license=license, license_link=license_link,
                      rules=rules, bench=speed, bench_mismatches=bench_unbound, evaluation=evaluation)
    manifest = _manifest(spec, target, figures, findings, validated, forced, speed)
    manifest["evaluation_files"] = [f.path for f in evaluation]
    sources = upload_sources(spec, card, manifest) + [(f.path, f.data) for f in evaluation]
    shown = without_credentials(endpoint)
    result = PushResult(
        repo_id=repo_id, endpoint=shown, revision=revision, create_pr=create_pr, private=private,
        dry_run=dry_run, forced=forced, validated=validated, url=f"{shown}/{repo_id}", commit_url=None,
        commit_oid=None, pr_url=None, files=[], card=card, findings=findings, warnings=warnings,
    )
    if dry_run:
        result.files = [describe_file(path, source) for path, source in sources]
        result.hub_check = check_access(endpoint, repo_id, find_token(token), revision=revision, offline=offline)
        return result
    version = "EAGLE-3.1" if spec.eagle_version == "3.1" else "EAGLE-3"
    message = commit_message or f"Upload {version} draft (eaglekit {__version__})"
    commit = commit_to_hub(endpoint, repo_id, sources, message, resolve_token(token), revision=revision,
                           create_pr=create_pr, private=private, warnings=result.warnings)
    result.url, result.commit_url, result.commit_oid = commit.url, commit.commit_url, commit.commit_oid
    result.pr_url, result.files = commit.pr_url, commit.files
    return result


def _finetune_first(draft_dir: str, target: str | None) -> str:
    """The finetune a warm start needs, as a command when the target is known (--target or the draft's record)."""
    if target is None:
        return ("fine-tune it first with `eaglekit finetune`, giving its target model (Hub id or folder) as --target "
                "(this push was given none)")
    draft = draft_dir.rstrip("/")
    return f"run `{shlex.join(['eaglekit', 'finetune', draft, f'{draft}-tuned', '--target', target])}` first"


def _refuse_unfit_draft(spec: DraftSpec, findings: list[Finding], draft_dir: str, force: bool,
                        target: str | None) -> bool:
    """Refuse a draft that would fail in vLLM, an untrained warm start, or a finetune measured no better than its
    source, unless `force`; whether any of them is being pushed anyway (the card and eaglekit.json then say so)."""
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
                            f"its source; {_finetune_first(draft_dir, target)}, or pass --force (the card then says "
                            "so)", draft_dir)
    worse = finetune_without_gain(spec.config)
    if worse and not force:
        raise EaglekitError(f"refusing to push a draft its finetune did not measure better than its source ({worse}); "
                            "pass --force to publish it anyway", draft_dir)
    return bool(errors) or bool(warm_start) or bool(worse)


def _unbound_evidence(report: VerifyReportFile | None, bench: VerifyReportFile | None, spec: DraftSpec,
                      declared: PushTarget, endpoint: str, token: str | None, force: bool,
                      offline: bool) -> tuple[list[str], list[str]]:
    """Why the verify and the bench report do not describe these files and this target (empty: they do); a card
    must not credit a draft with another's figures, so a mismatch refuses the push unless `force`."""
    unbound = report_mismatches(report.doc, spec, declared, endpoint=endpoint, token=token,
                                offline=offline) if report else []
    if report is not None and unbound and not force:
        raise EaglekitError(f"refusing this verify report: {unbound[0]} (rerun `eaglekit verify`, or pass --force: "
                            "the card then says so)", report.path)
    bench_unbound = report_mismatches(bench.doc, spec, declared, endpoint=endpoint, token=token,
                                      offline=offline) if bench else []
    if bench is not None and bench_unbound and not force:
        raise EaglekitError(f"refusing this bench report: {bench_unbound[0]} (rerun `eaglekit bench`, or pass "
                            "--force: the card then says so)", bench.path)
    return unbound, bench_unbound


def _publishing_warnings(declared: PushTarget, license: str | None, license_link: str | None) -> list[str]:
    """What the card will lack (a target to name in serve commands, a licence); a licence link needs --license
    other, since a named licence already has its own."""
    warnings = []
    if not declared.repo_id:
        unnamed = "no target model known" if declared.config is None else "the --target folder records no Hub id"
        warnings.append(f"{unnamed}: pass the target's Hub id as --target so the card's serve commands name it")
    if license_link and license != "other":
        raise UsageError("--license-link names a licence of its own: use it with --license other")
    if not license:
        warnings.append("no --license: the card states none (a draft trained on a target's outputs usually "
                        "carries the target's licence)")
    return warnings


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
