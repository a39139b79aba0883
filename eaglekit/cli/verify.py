"""`eaglekit verify`: a real greedy speculative decode of a draft against its target."""

from __future__ import annotations

import json
import os

import click
from rich.table import Table

from eaglekit.cli.output import (
    acceptance_text,
    aux_ids,
    conditions,
    decode_options,
    emit_json,
    format_option,
    given_paths,
    identifier_table,
    key_value_table,
    out,
    print_findings,
    quantization_text,
    sampling_text,
    shell_command,
    styled,
    vllm_options,
    with_given,
    write_report,
)
from eaglekit.cli.progress import ProgressLog
from eaglekit.decode.stats import too_few, too_few_text
from eaglekit.errors import EaglekitError, UsageError
from eaglekit.runner import REFERENCE, RUNNERS

EXAMPLES = """
\b
Examples:
  eaglekit verify ./draft --target ./SmolLM2-135M-Instruct
  eaglekit verify ./draft --target ./Llama-3.1-8B-Instruct --device cuda -k 6 --diagnose
  eaglekit verify ./draft --target ./target --context-tokens 2000 --min-acceptance 2.0 --save-report verify.json
  eaglekit verify ./draft --target ./target -k 8 --context-tokens 0,1024,2048 --template chat,system,raw --plot v.png
"""

@click.command("verify", epilog=EXAMPLES)
@click.argument("draft")
@decode_options
@click.option("--aux-layer-ids", "aux_layer_ids", help="Override the aux ids (vLLM convention), e.g. 2,15,27.")
@click.option("--as-eaglekit-reads", is_flag=True,
              help="Decode only eaglekit's reading of the draft; by default, when vLLM would read the files "
                   "differently (other aux ids, norm flags, or not at all), they are decoded that way too and both τ "
                   "are reported.")
@click.option("--engine-version", help="The vLLM version whose reading is mirrored (default: the latest modelled).")
@click.option("--vllm-runner", type=click.Choice(["v1", "v2"]),
              help="vLLM's model runner to mirror (default: that version's default; CPU builds run only v1).")
@click.option("--diagnose", is_flag=True,
              help="Also score the drafter under competing readings (aux ids +-1, engine default, flipped norm "
                   "flags, fc block orders) on one captured target pass, and name a better one.")
@click.option("--min-acceptance", type=float, help="Exit 1 when the mean acceptance length is below this.")
@click.option("--save-report", type=click.Path(dir_okay=False), help="Also write the JSON report here (for push).")
@click.option("--profile-out", type=click.Path(dir_okay=False),
              help="Write the measured acceptance as specdec_bench's speculation_profile.json (schema 1.0; "
                   "conditional and marginal rates) and print vLLM's synthetic_acceptance_rates.")
@click.option("--no-progress", is_flag=True, help="No progress bar on stderr.")
@click.option("--engine", type=click.Choice([*RUNNERS, "both"]), default=REFERENCE, show_default=True,
              help="reference: eaglekit's own decode; vllm: the same prompts through vLLM's offline API, measured by "
                   "vLLM's counters (any target size); both: the two side by side with a verdict.")
@vllm_options("--engine vllm or both")
@format_option
def verify_command(draft, target, k, max_new_tokens, prompts_file, limit, categories, turns, context_tokens, template,
                   plot, device, dtype, target_quantization, temperature, top_p, seed, aux_layer_ids,
                   as_eaglekit_reads, engine_version,
                   vllm_runner, diagnose,
                   min_acceptance, save_report, profile_out, no_progress, engine, engine_options,
                   output_format):
    """Run DRAFT against its target: lossless check, acceptance length, speed, drift, optional diagnosis; under
    each condition (template x context length) asked for."""
    from eaglekit.decode.options import VerifyOptions
    from eaglekit.decode.settings import plain_report
    from eaglekit.io.outputs import Role
    from eaglekit.plotting import check_plot_path
    from eaglekit.runtime.engine import refuse_unused
    from eaglekit.verify.plot import plot_verify
    from eaglekit.verify.run import verify_conditions, verify_in_engine

    options = VerifyOptions(
        num_speculative_tokens=k, max_new_tokens=max_new_tokens, prompts_file=prompts_file, limit=limit,
        **conditions(context_tokens, template), device=device, dtype=dtype, aux_layer_ids=aux_ids(aux_layer_ids),
        diagnose=diagnose, min_acceptance=min_acceptance, engine=engine, categories=tuple(categories), turns=turns,
        as_eaglekit_reads=as_eaglekit_reads, engine_version=engine_version, vllm_runner=vllm_runner,
        target_quantization=target_quantization, temperature=temperature, top_p=top_p, seed=seed,
        engine_options=engine_options,
        outputs=(Role("--save-report", save_report or ""), Role("--profile-out", profile_out or ""),
                 Role("--plot", plot or "")),
    )
    options.check()
    if engine == REFERENCE:
        refuse_unused(engine_options, "--engine reference")
    if profile_out and not plain_report(options.conditions):
        raise UsageError("--profile-out describes the chat template at one context length: give one "
                         "--context-tokens value and --template chat")
    if plot:
        if options.engine_only:
            raise UsageError("--plot draws the reference decode's conditions: use --engine reference or both")
        check_plot_path(plot)
    if options.engine_only:
        with ProgressLog("verify", not no_progress) as progress:
            doc = verify_in_engine(draft, target, options, progress=progress)
        if save_report:
            write_report(save_report, doc)
        if profile_out:
            write_report(profile_out, doc["speculation_profile"])
        emit_json(doc) if output_format == "json" else render_engine(doc)
        if not doc["engine"]["lossless"]:
            raise EaglekitError(f"{draft}: vLLM's speculative output differs from its own target-only output on "
                                f"prompt(s) {doc['engine']['mismatched_prompts']}")
        return
    given = given_paths([draft, prompts_file, save_report, plot, profile_out], [target])
    with ProgressLog("verify", not no_progress, given=given) as progress:
        sweep = verify_conditions(draft, target, options, progress=progress)
    doc = sweep.to_dict()
    if save_report:
        write_report(save_report, doc)
    profile = sweep.reports[0].speculation_profile() if profile_out else None
    if profile is not None:
        write_report(profile_out, profile)
    written = plot_verify(sweep, plot) if plot else None
    if output_format == "json":
        emit_json(doc)
    else:
        render(with_given(doc, given), draft)
        if profile is not None:
            render_profile(profile, profile_out)
        if written:
            out.print(f"plot: {written}")
    def under(report) -> str:
        return f" under {report.settings.condition.label}" if len(sweep.reports) > 1 else ""

    for report in sweep.reports:
        if report.lossless is False:
            bad = [o for o in report.outcomes if not o.identical and not (o.divergence or {}).get("numerical_tie")]
            raise EaglekitError(f"{draft}: speculative output differs from the target's own greedy output"
                                f"{under(report)} on {len(bad)} prompt(s) (first: {bad[0].name!r} at token "
                                f"{(bad[0].divergence or {}).get('position')})")
    for report in sweep.reports:
        if not report.passed:
            raise EaglekitError(f"{draft}: mean acceptance length {report.acceptance_length:.2f}{under(report)} is "
                                f"below --min-acceptance {min_acceptance}")


def _interval_text(doc: dict) -> str:
    interval = doc["acceptance_length_interval"]
    if doc["too_few_samples"]:
        return f"  95 % interval: {too_few_text(doc['samples'])}"
    return f"  95 % interval {interval['low']:.2f} – {interval['high']:.2f}" if interval else ""


def _engine_rows(e: dict) -> list[tuple[str, object]]:
    seconds = e["timings"]
    return [
        ("engine", f"{e['engine']} {e['version']}"),
        ("lossless", styled(("yes", "green")) if e["lossless"] else styled(("NO", "bold red"))),
        ("acceptance length, pooled τ", styled((f"{e['acceptance_length']:.3f}", "bold"))),
        ("τ counted as", acceptance_text(e["acceptance_settings"])),
        ("per position", _rates(e["per_position_acceptance"])),
        ("counters", f"{e['num_drafts']} drafts, {e['num_accepted_tokens']} accepted "
                     f"({', '.join(map(str, e['num_accepted_tokens_per_pos']))} per position)"),
        ("aux layers", e["aux_layers_log"] or "the engine printed none (it fell back to its default)"),
        ("tokens/s", f"{seconds['tokens_per_s_spec']:.1f} with the draft vs {seconds['tokens_per_s_target']:.1f} "
                     f"target alone (engine start {seconds['spec_init_s']:.0f} s)"),
    ]


def render_engine(doc: dict) -> None:
    out.print(key_value_table([("draft", doc["draft"]), ("target", doc["target"]),
                               ("run", f"k={doc['num_speculative_tokens']}, {doc['max_new_tokens']} new tokens, "
                                       f"{doc['dtype']}, {doc['prompts']['count']} prompts"),
                               *_engine_rows(doc["engine"])], title="eaglekit verify --engine vllm"))
    if doc["categories"]:
        out.print()
        category_rows(doc["categories"])


def render_profile(profile: dict, path: str) -> None:
    checks = profile["validation"]
    passed = checks["mean_consistency"]["passed"] and checks["marginal_monotonicity"]["passed"]
    out.print(styled(("speculation profile ", "bold"), f"{path} (schema {profile['schema_version']}; checks "
                     f"{'passed' if passed else 'FAILED'})"))
    synthetic = {"rejection_sample_method": "synthetic",
                 "synthetic_acceptance_rates": profile["marginal_accept_rates"]}
    out.print("vLLM speculative-config keys that replay it: " + json.dumps(synthetic), soft_wrap=True)


def category_rows(categories: dict, title: str = "By category") -> None:
    rows = []
    for name, row in categories.items():
        interval = row["acceptance_length_interval"]
        rows.append([name, str(row["prompts"]), f"{row['acceptance_length']:.3f}",
                     too_few_text(row["samples"]) if row["too_few_samples"]
                     else f"{interval['low']:.3f} – {interval['high']:.3f}" if interval else "—",
                     _rates(row["per_position_acceptance"], " "), _rates(row["conditional_acceptance"], " ")])
    identifier_table(title, ["category", "prompts", "τ", "95 % interval", "per position", "conditional"], rows)
    out.print("interval: 95 % bootstrap over conversations", style="dim")


def _rates(values, sep: str = "  ") -> str:
    return sep.join(f"{v:.2f}" for v in values)


def _header(doc: dict, prompts: str) -> None:
    out.print(key_value_table([
        ("draft", doc["draft"]),
        ("target", doc["target"]),
        ("EAGLE", f"{doc['eagle_version']}  ({', '.join(f'{k}={v}' for k, v in doc['flags'].items())})"),
        ("aux ids", styled(f"{doc['aux_layer_ids']}  ", (doc["aux_layer_ids_source"], "dim"))),
        ("run", f"k={doc['num_speculative_tokens']}, {doc['max_new_tokens']} new tokens, {doc['dtype']} on "
                f"{doc['device']}"),
        ("prompts", prompts),
        ("target numerics", quantization_text(doc.get("target_quantization"))),
        ("sampling", sampling_text(doc["sampling"])),
        ("τ counted as", acceptance_text(doc["acceptance_settings"])),
    ], title="eaglekit verify"))
    out.print()
    if doc["checks"]:
        print_findings(doc["checks"], title="Compatibility")
    else:
        out.print(styled(("Compatibility: ", "bold"), ("the draft fits the target, and vLLM reads the files as this "
                                                     "decode does", "green")))


def _speed_text(measured: dict) -> str:
    """The reference decode's speed ratio with its spread over prompts; when the spread holds 1× it says the ratio
    means nothing here (the serving figure is `eaglekit bench`'s)."""
    if measured["speedup"] is None:
        return "—"
    interval = measured.get("speedup_interval")
    prompts = len(measured["per_prompt"])
    if too_few(prompts):
        return f"{measured['speedup']:.2f}×; its spread over prompts: {too_few_text(prompts)}; not a serving figure"
    if interval is None:
        return f"{measured['speedup']:.2f}×, no finite spread over prompts to judge it by"
    text = f"{measured['speedup']:.2f}× [{interval['low']:.2f}, {interval['high']:.2f}] over prompts"
    if interval["low"] <= 1.0 <= interval["high"]:
        return text + "; the spread holds 1×, so this ratio is not a measured speed-up (eaglekit bench measures one)"
    return text + "; batch 1 on this machine, not a serving figure"


def _result(measured: dict, k: int, title: str) -> None:
    """One condition's measurement: the lossless verdict, τ, both rate definitions and the speed."""
    if measured["lossless"] is None:
        lossless = styled(("not judged", "dim"), " (sampled: one draw per prompt cannot show it; tests do)")
    elif measured["lossless"]:
        lossless = styled(("yes", "green"))
    else:
        lossless = styled(("NO", "bold red"))
    if measured["lossless"] and not measured["exact_match"]:
        lossless.append(" (differs only after numerical ties)", "dim")
    split = measured["time_split"]
    speedup = _speed_text(measured)
    out.print(key_value_table([
        ("lossless", lossless),
        ("acceptance length, pooled τ", styled((f"{measured['acceptance_length']:.2f}", "bold"), f" (max {k + 1})",
                                       _interval_text(measured))),
        ("per position", _rates(measured["per_position_acceptance"])),
        ("conditional", _rates(measured["conditional_acceptance"])),
        ("tokens/s", f"{measured['tokens_per_s_spec']:.1f} with the draft vs {measured['tokens_per_s_target']:.1f} "
                     f"target alone, reference decode ({speedup})"),
        ("time", f"spec {split['spec_total_s']:.1f} s (draft {split['spec_draft_s']:.1f} s, target "
                 f"{split['spec_target_s']:.1f} s); target alone {split['target_only_s']:.1f} s"),
    ], title=title))
    out.print()


def render_sweep(doc: dict) -> None:
    """Several conditions: the draft and its checks once, then one table per condition."""
    from eaglekit.decode.settings import Condition

    first = doc["conditions"][0]["prompts"]
    _header(doc, f"{first['name']} ({first['count']}); {len(doc['conditions'])} condition(s)")
    for entry in doc["conditions"]:
        label = Condition(entry["template"], entry["context_tokens"]).label
        _result(entry, doc["num_speculative_tokens"],
                f"Result: {label} (mean {entry['prompts']['mean_prompt_tokens']:.0f} prompt tokens)")
        if entry["categories"]:
            category_rows(entry["categories"], f"By category: {label}")
            out.print()
    drift_table([(Condition(e["template"], e["context_tokens"]).label, e) for e in doc["conditions"]])


def drift_table(measured: list[tuple[str | None, dict]]) -> None:
    """Hidden-state RMS and attention on the first position per draft depth, beside that depth's acceptance: where
    a chain drifts as it deepens. Under several conditions, one section each, so drift reads across context
    lengths and templates."""
    by_condition = measured[0][0] is not None
    drift = Table(title="Drift per draft depth" + (", by condition" if by_condition else ""), title_justify="left")
    if by_condition:
        drift.add_column("condition")
    for name in ("depth", "hidden RMS", "sink attention", "acceptance"):
        drift.add_column(name, justify="right")
    for label, doc in measured:
        rows = list(zip(doc["drift"], doc["per_position_acceptance"]))
        for i, (row, rate) in enumerate(rows):
            rms = "—" if row["hidden_rms"] is None else f"{row['hidden_rms']:.3g}"
            sink = "—" if row["sink_attention"] is None else f"{row['sink_attention']:.3f}"
            cells = [str(row["depth"]), rms, sink, f"{rate:.2f}"]
            drift.add_row(*([label if i == 0 else ""] if by_condition else []), *cells,
                          end_section=by_condition and i == len(rows) - 1)
    out.print(drift)


def render(doc: dict, draft: str) -> None:
    conditions = doc.get("conditions")
    if conditions is not None and len(conditions) > 1:
        render_sweep(doc)
        return
    if conditions is not None:  # one condition under another template: the whole report, as for chat
        doc = {**doc, **conditions[0]}
    prompts = doc["prompts"]
    context = f", {prompts['context_tokens']} tokens of context" if prompts["context_tokens"] else ""
    context += f", template {doc['template']}" if "template" in doc else ""
    _header(doc, f"{prompts['name']} ({prompts['count']}, mean {prompts['mean_prompt_tokens']:.0f} tokens{context})")
    _result(doc, doc["num_speculative_tokens"], "Result")

    served = doc["served"]
    if served is not None:
        style = "bold yellow" if served["differs"] else "green"
        out.print(styled(("served as is: ", style), served["message"]))
        for note in served["silent"]:
            out.print(styled(("  silently: ", "yellow"), note))
        out.print()
    if doc["categories"]:
        category_rows(doc["categories"])
        out.print()

    drift_table([(None, doc)])

    if doc.get("engine"):
        cmp = doc["engine_comparison"]
        out.print()
        table = Table(title="Reference vs engine", title_justify="left")
        table.add_column("")
        for col in ("aux ids", "τ", "per position", "drafts", "accepted"):
            table.add_column(col, no_wrap=True)
        e = doc["engine"]
        table.add_row("reference", ",".join(map(str, cmp["reference_aux_layer_ids"])),
                      f"{doc['acceptance_length']:.3f}", _rates(doc["per_position_acceptance"], " "),
                      str(doc["num_drafts"]), str(doc["num_accepted_tokens"]))
        if cmp["reference_as_served_acceptance_length"] is not None:
            table.add_row("reference, engine's ids", ",".join(map(str, cmp["engine_aux_layer_ids"])),
                          f"{cmp['reference_as_served_acceptance_length']:.3f}", "", "", "")
        table.add_row(f"{e['engine']} {e['version']}", ",".join(map(str, cmp["engine_aux_layer_ids"] or [])),
                      f"{e['acceptance_length']:.3f}", _rates(e["per_position_acceptance"], " "), str(e["num_drafts"]),
                      str(e["num_accepted_tokens"]))
        out.print(table)
        style = {"agree": "green", "engine reads other aux ids": "bold yellow", "disagree": "bold red",
                 "different decodes": "yellow"}[cmp["verdict"]]
        out.print(styled((f"{cmp['verdict']}: ", style), cmp["message"]))
        if not e["lossless"]:
            out.print(styled(("vLLM's speculative output differs from its own target-only output", "bold red")))
    if "hypotheses" in doc:
        table = Table(title="Diagnosis: one target pass, competing readings", title_justify="left",
                      caption="TF: teacher-forced along the target's continuation; z: paired against the declared "
                              "reading", caption_justify="left")
        table.add_column("hypothesis", no_wrap=True)
        table.add_column("aux ids", no_wrap=True)
        table.add_column("τ", justify="right")
        table.add_column("per position", no_wrap=True)
        table.add_column("TF τ", justify="right")
        table.add_column("z", justify="right")
        for h in doc["hypotheses"]:
            name = styled((h["name"], "bold")) if h["name"] == doc["diagnosis"]["best"] else h["name"]
            table.add_row(name, ",".join(map(str, h["aux_layer_ids"])), f"{h['acceptance_length']:.2f}",
                          _rates(h["per_position_acceptance"], " "), f"{h['teacher_forced_acceptance_length']:.2f}",
                          "—" if h["paired_z"] is None else f"{h['paired_z']:+.1f}")
        out.print(table)
        d = doc["diagnosis"]
        style = {"declared": "green", "mismatch": "bold yellow", "broken": "bold red"}[d["verdict"]]
        out.print(styled((d["message"], style)))
        if d["fix"]:
            fix = shell_command(runnable_fix(d["fix"], draft))  # a command to copy: never wrapped
            out.print(styled("fix: ", (fix, "bold")), soft_wrap=True)


def runnable_fix(fix: str, draft: str) -> str:
    """The diagnosis's fix as a command to paste: the draft as the user named it, the output beside the current folder
    named after it (the report itself names local folders by name only)."""
    import shlex

    if not fix.startswith("eaglekit "):
        return fix
    name = os.path.basename(os.path.abspath(draft))
    return fix.replace("DRAFT", shlex.quote(draft), 1).replace("OUT", shlex.quote(f"{name}-diagnosed"), 1)
