"""The model card of a published draft: Hub metadata plus what a user needs to serve it correctly.

The body spells out the serving command because the Hub's own `vllm serve <repo>` widget would load the draft as a
standalone LM. The YAML is built with `ModelCardData.to_yaml()` and no template engine (Jinja2 is not a dependency).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from eaglekit import __version__
from eaglekit.config_view import nested
from eaglekit.engines import RECORDS
from eaglekit.findings import Finding
from eaglekit.hub.attachments import Attachment
from eaglekit.hub.card_figures import finetune_section, numerics_note, speed_section, verify_section
from eaglekit.hub.card_text import code, is_repo_id, public_source, text
from eaglekit.redact import redact
from eaglekit.rules import ValidationReport
from eaglekit.serving import (
    NOT_AS_IS,
    MinimumVersion,
    minimum_versions,
    serve_command,
    serving_support,
)
from eaglekit.spec import DraftSpec

EAGLE3_ARXIV = "2503.01840"
EAGLE31_ARXIV = "2605.09992"
NUM_SPECULATIVE_TOKENS = 3
TARGET_PLACEHOLDER = "<TARGET_MODEL>"
AUX_CONVENTION = "vLLM convention: input of layer i / HF `hidden_states` index"


def provenance(spec: DraftSpec) -> dict[str, Any]:
    """The `eaglekit` block eaglekit writes into config.json of what it produced ({} for foreign checkpoints)."""
    block = spec.config.get("eaglekit")
    return block if isinstance(block, dict) else {}


def recorded_target(spec: DraftSpec) -> str | None:
    """The target repo id the checkpoint itself names: eaglekit provenance, then a speculators verifier."""
    candidates = [provenance(spec).get("target")]
    speculators = spec.config.get("speculators_config")
    if isinstance(speculators, dict) and isinstance(speculators.get("verifier"), dict):
        candidates.append(speculators["verifier"].get("name_or_path"))
    return next((c for c in candidates if is_repo_id(c)), None)


def source_draft(spec: DraftSpec) -> str | None:
    """The published draft this checkpoint was converted from, when eaglekit recorded a Hub id."""
    source = provenance(spec).get("source")
    return source if is_repo_id(source) else None


def eagle_label(spec: DraftSpec) -> str:
    version = spec.eagle_version
    if version == "3.1":
        return "EAGLE-3.1"
    if version == "3.1-partial":
        return (f"EAGLE-3 with a partial 3.1 flag set (fc_norm={_yes(spec.flags.fc_norm)}, "
                f"norm_output={_yes(spec.flags.norm_output)})")
    return "EAGLE-3"


def card_tags(spec: DraftSpec) -> list[str]:
    tags = ["eagle3"]
    if spec.eagle_version == "3.1":
        tags.append("eagle3.1")
    tags += ["speculative-decoding", "draft-model", "vllm", "eaglekit"]
    if spec.config_layout == "speculators":
        tags.append("speculators")
    tags.append(f"arxiv:{EAGLE3_ARXIV}")
    if spec.eagle_version == "3.1":
        tags.append(f"arxiv:{EAGLE31_ARXIV}")
    return tags


def build_card(
    spec: DraftSpec,
    repo_id: str,
    *,
    target: str | None = None,
    report: Mapping[str, Any] | None = None,
    findings: Sequence[Finding] = (),
    validated: bool = True,
    forced: bool = False,
    report_mismatches: Sequence[str] = (),
    license: str | None = None,
    license_link: str | None = None,
    rules: ValidationReport | None = None,
    bench: Mapping[str, Any] | None = None,
    bench_mismatches: Sequence[str] = (),
    evaluation: Sequence[Attachment] = (),
) -> str:
    """Return README.md text: YAML front matter, then the body. `forced`: pushed despite error findings;
    `report_mismatches`: why the verify report describes other files (pushed with --force); `rules`: the caller's
    rules run over every engine, which the serving sections show (run here when absent); `bench`: an
    `eaglekit bench` report, the serving-speed section (`bench_mismatches` as `report_mismatches`); `evaluation`:
    the reports and plots uploaded beside the card, linked and shown."""
    from huggingface_hub import ModelCardData

    target = target or recorded_target(spec)
    source = source_draft(spec)
    metadata: dict[str, Any] = {}
    if source:
        # The Hub has no "converted" relation; finetune is what it would infer and the body says what happened.
        metadata = {"base_model": source, "base_model_relation": "finetune"}
    elif target:
        metadata = {"base_model": target}
    if license_link:
        metadata.update(license_name=license_link.rstrip("/").rsplit("/", 1)[-1], license_link=license_link)
    # No library_name / pipeline_tag: with them the Hub offers a transformers snippet and a plain `vllm serve` of
    # the draft, neither of which can run a draft model; the body gives the commands that do.
    data = ModelCardData(license=license, tags=card_tags(spec), **metadata)
    sections = [
        _intro(spec, repo_id, target, source),
        _forced_notice(findings) if forced and any(f.severity == "error" for f in findings) else "",
        _warm_start_notice(spec),
        _no_gain_notice(spec),
        _draft_table(spec, target),
        _serving(spec, repo_id, target, rules),
        speed_section(bench, bench_mismatches) if bench else "",
        verify_section(report, report_mismatches, speed=bench is None) if report else "",
        numerics_note(report, bench) if report and bench else "",
        _evaluation_section(evaluation),
        finetune_section(provenance(spec)),
        _validation_section(findings, validated),
        _provenance_section(spec),
        _citations(spec),
    ]
    body = redact("\n".join(s for s in sections if s))  # no secret or local path from any file it quotes
    card = "---\n" + data.to_yaml() + "\n---\n\n" + body
    # a name read from a file or the command line may hold an undecodable byte (a lone surrogate): the card is
    # UTF-8 text, so such a character is written as its escape
    return card.encode("utf-8", "backslashreplace").decode("utf-8")


def _yes(flag: bool | None) -> str:
    return "not written" if flag is None else ("true" if flag else "false")


def _ref(repo: str | None) -> str:
    if repo is None:
        return f"`{TARGET_PLACEHOLDER}` (no target recorded: pass `--target` when pushing)"
    return f"[`{repo}`](https://huggingface.co/{repo})"


def _intro(spec: DraftSpec, repo_id: str, target: str | None, source: str | None) -> str:
    lines = [
        f"# {repo_id.split('/', 1)[1]}",
        "",
        f"An {eagle_label(spec)} speculative-decoding draft model for {_ref(target)}. It proposes tokens that the "
        "target verifies, so outputs match the target's while decoding runs faster. It is not a standalone "
        "language model: serve it with the commands below, not on its own.",
        "",
    ]
    if source:
        lines.append(f"Converted from [`{source}`](https://huggingface.co/{source}) with eaglekit "
                     f"{provenance(spec).get('version', __version__)}; checkpoint layout: {spec.producer}.")
    else:
        lines.append(f"Checkpoint layout: {spec.producer} (family `{spec.family}`). Published with eaglekit "
                     f"{__version__}.")
    return "\n".join(lines) + "\n"


def _forced_notice(findings: Sequence[Finding]) -> str:
    errors = [f for f in findings if f.severity == "error"]
    return (
        f"> **Warning: forced despite validation errors.** This draft was pushed with `--force` although eaglekit "
        f"found {len(errors)} error(s) for vLLM (listed under Validation). It may fail to load or serve wrong tokens.\n"
    )


def _warm_start_notice(spec: DraftSpec) -> str:
    from eaglekit.provenance import untrained_upgrade

    found = untrained_upgrade(spec.config)
    if not found:
        return ""
    function, summary = found
    if function == "eagle3-function":
        return ("> **Not yet trained as EAGLE-3.1.** eaglekit upgrade switched on the EAGLE-3.1 flags (`fc_norm`, "
                "`norm_output`) and set their weights so the draft keeps its EAGLE-3 source's function "
                f"({summary}). It serves at its source's acceptance. What EAGLE-3.1 is published to gain (depth, "
                "long context, template drift) needs training it as 3.1, and is measured, not assumed: compare the "
                "source and the retrain at the contexts and templates served (`eaglekit compare`).\n")
    return ("> **Warning: untrained warm start.** eaglekit upgrade changed this draft's function without training "
            f"({summary}); it accepts fewer tokens than the draft it came from until it is fine-tuned "
            "(`eaglekit finetune`).\n")


def _no_gain_notice(spec: DraftSpec) -> str:
    from eaglekit.provenance import finetune_without_gain

    measured = finetune_without_gain(spec.config)
    if not measured:
        return ""
    return ("> **Warning: fine-tuned without a measured gain.** eaglekit finetune wrote this draft although its "
            f"held-out acceptance was not resolved better than its source's ({measured}).\n")


def _draft_table(spec: DraftSpec, target: str | None) -> str:
    g, aux, vocab, flags = spec.geometry, spec.aux, spec.vocab, spec.flags
    if aux.ids is not None:
        ids = f"`{list(aux.ids)}` ({AUX_CONVENTION})"
        if aux.as_written is not None and aux.as_written != aux.ids:
            ids += f"; written as `{list(aux.as_written)}` ({aux.convention}-of-layer)"
    elif aux.as_written is not None:
        ids = f"written as `{list(aux.as_written)}`, convention unknown"
    else:
        ids = "not recorded: engines fall back to their default (2, L//2, L-3)"
    reduced = vocab.vocab_size is not None and vocab.draft_vocab_size < vocab.vocab_size
    rows = [
        ("Target (verifier)", _ref(target)),
        ("Algorithm", f"`eagle3` ({eagle_label(spec)})"),
        ("Architecture", ", ".join(f"`{a}`" for a in spec.architectures) or "not written"),
        ("model_type", f"`{spec.model_type}`" if spec.model_type else "not written"),
        ("Attention", spec.attention),
        ("Draft decoder layers", str(g.num_layers)),
        ("Hidden size H / target hidden size T", f"{g.hidden_size} / {g.target_hidden_size or 'unknown'}"),
        ("Aux hidden states K", str(spec.num_aux_hidden_states or "unknown")),
        ("Aux layer ids", ids),
        ("Vocabulary V / draft vocabulary Vd",
         f"{vocab.vocab_size or 'unknown'} / {vocab.draft_vocab_size}"
         + (" (`d2t` maps draft to target ids)" if reduced else "")),
        ("fc_norm", _yes(flags.fc_norm)),
        ("norm_output", _yes(flags.norm_output)),
        ("norm_before_residual", _yes(flags.norm_before_residual)),
        ("norm_before_fc", _yes(flags.norm_before_fc)),
        ("lm_head", "own weights" if spec.has_lm_head else "shared from the target"),
        ("embed_tokens", "own weights" if spec.has_embed_tokens else "shared from the target"),
        ("Weights", f"{spec.dtype}, {spec.num_parameters:,} parameters"),
    ]
    table = "\n".join(f"| {k} | {v} |" for k, v in rows)
    return f"## Draft\n\n| | |\n|---|---|\n{table}\n"


def _requirement(need: MinimumVersion) -> str:
    record = RECORDS[need.engine]
    if need.version:
        return f"Requires {record.label} ≥ {need.version} ({'; '.join(need.reasons)})."
    if record.versions_modelled:
        return f"Any {record.label} release with EAGLE-3 support serves it (it relies on no later feature)."
    return (f"Checked against {record.label} {record.latest}, the release eaglekit models; it relies on no later "
            "feature.")


def _serving(spec: DraftSpec, repo_id: str, target: str | None, rules: ValidationReport | None = None) -> str:
    """One section per engine that serves these files (its command with the settings it needs), the GGUF route
    for llama.cpp, then the engines that cannot serve them as they are, and why."""
    needs = minimum_versions(spec)
    support = {s.engine: s for s in serving_support(spec, report=rules)}
    shown = target or TARGET_PLACEHOLDER
    k = NUM_SPECULATIVE_TOKENS
    sections, refused = [], []
    for engine in RECORDS:
        s, record = support[engine], RECORDS[engine]
        label = record.label
        if s.verdict == NOT_AS_IS and s.engine_specific:  # a fault of the files alone is the Validation section's
            to = record.dialect
            remedy = f" `eaglekit upgrade {repo_id} draft-{to} --to {to}` writes the files it reads." if s.fix else ""
            refused.append(f"- **{label}**: {s.reason.split(': ', 1)[-1]}.{remedy}")
        elif record.needs_conversion:
            converted = f"draft.{record.dialect}"
            commands = (f"eaglekit upgrade {repo_id} {converted} --to {record.dialect} --target <TARGET_GGUF>\n"
                        f"{serve_command(engine, '<TARGET_GGUF>', converted, k)}")
            sections.append(f"## Use with {label}\n\n{label} loads GGUF: convert the draft with eaglekit (it "
                            f"writes the draft's own target layers and vocabulary map), then serve it.\n\n"
                            f"```bash\n{commands}\n```\n\n{_requirement(needs[engine])}\n")
        else:
            pinned = (f" {label} needs the setting beside the files (the target layers the draft was trained on, or "
                      "parallel drafting): it does not take it from the config as written." if s.settings else "")
            sections.append(f"## Use with {label}\n\n```bash\n{serve_command(engine, shown, repo_id, k, s.settings)}"
                            f"\n```\n\n{_requirement(needs[engine])}{pinned}\n")
    if refused:
        sections.append("## Engines that cannot serve these files as they are\n\n" + "\n".join(refused) + "\n")
    return "\n".join(sections)


"""What a string read from a file could use to become Markdown or HTML in the card: emphasis, code, links, tags,
table cells, entities. Escaped with a backslash wherever such a string is rendered."""


def _evaluation_section(files: Sequence[Attachment]) -> str:
    """Links to the uploaded reports and the plots shown inline, by their paths in the repository (relative links:
    the Hub resolves them in the revision the card is in)."""
    if not files:
        return ""
    reports = [f"- [`{f.path}`]({f.path}): the `{f.made_by}` report the figures above are taken from" for f in files
               if f.kind == "report"]
    plots = [f"![{text(f.path.rsplit('/', 1)[-1])}]({f.path})" for f in files if f.kind == "plot"]
    lines = ["## Evaluation files", "", "Uploaded with this draft under `eval/`: reports as eaglekit wrote them "
             "(secrets removed, local paths reduced to folder names) and plots it drew."]
    if reports:
        lines += ["", *reports]
    if plots:
        lines += ["", "\n\n".join(plots)]
    return "\n".join(lines) + "\n"


def _validation_section(findings: Sequence[Finding], validated: bool) -> str:
    if not validated:
        return "## Validation\n\nNot validated: eaglekit's rules engine was not available when this was pushed.\n"
    counts = {s: sum(1 for f in findings if f.severity == s) for s in ("error", "warning")}
    lines = [f"## Validation\n\neaglekit's vLLM rules: {counts['error']} error(s), {counts['warning']} warning(s)."]
    shown = [f for f in findings if f.severity in ("error", "warning")]
    if shown:
        lines.append("")
        lines += [f"- **{f.severity}** `{f.code}`: {f.message}" for f in shown]
    return "\n".join(lines) + "\n"


COMMANDS = {"upgrade": "`eaglekit upgrade`", "finetune": "`eaglekit finetune`"}


def _provenance_section(spec: DraftSpec) -> str:
    """Who made these files from what, in a few readable lines (the full record stays in config.json)."""
    chain: list[Mapping[str, Any]] = []
    block: Any = provenance(spec)
    while isinstance(block, Mapping) and block and len(chain) < 8:
        chain.append(block)
        block = block.get("source_provenance")
    if not chain:
        return ""
    lines = ["## Provenance", ""]
    for step in chain:
        command = COMMANDS.get(str(step.get("command")), code(step.get("command", "eaglekit")))
        source = public_source(step.get("source"))
        line = f"- {command} (eaglekit {text(step.get('version', '?'))})" + (f" from {source}" if source else "")
        if step.get("source_family"):
            line += f", {text(step['source_family'])} layout"
        if step.get("summary"):
            line += f": {text(step['summary'])}"
        lines.append(line)
        options = nested(step, "options")
        chosen = {k: v for k, v in options.items() if v not in (None, False, "", [], {})}
        if chosen:
            lines.append("  - options: " + ", ".join(code(f"{k}={v}") for k, v in chosen.items()))
        for detail in step.get("conversion") or []:
            lines.append(f"  - {text(detail)}")
        files = step.get("source_files")
        if isinstance(files, Mapping) and files:
            lines.append("  - source files: " + ", ".join(f"{code(name)} {text(str(digest)[7:19])}…"
                                                         for name, digest in sorted(files.items())))
    return "\n".join(lines) + "\n"


def _citations(spec: DraftSpec) -> str:
    lines = ["## Citation", "", f"- EAGLE-3: Li et al., arXiv:{EAGLE3_ARXIV} (https://arxiv.org/abs/{EAGLE3_ARXIV})"]
    if spec.eagle_version == "3.1":
        lines.append(f"- EAGLE-3.1: arXiv:{EAGLE31_ARXIV} (https://arxiv.org/abs/{EAGLE31_ARXIV})")
    return "\n".join(lines) + "\n"
