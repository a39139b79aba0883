"""`eaglekit compare`: two drafts of one target on the same prompts and the same captured target pass."""

from __future__ import annotations

import click

from eaglekit.cli.output import (
    acceptance_text,
    conditions,
    decode_options,
    finish_report,
    format_option,
    given_paths,
    identifier_table,
    key_value_table,
    out,
    quantization_text,
    sampling_text,
    vllm_options,
)
from eaglekit.cli.progress import ProgressLog
from eaglekit.runner import REFERENCE, RUNNERS

EXAMPLES = """
\b
Examples:
  eaglekit compare ./eagle3 ./eagle3.1 --target ./SmolLM2-135M-Instruct
  eaglekit compare ./a ./b --target ./target --prompts speed-bench-qualitative.jsonl --category coding --turns all
  eaglekit compare ./eagle3 ./eagle3.1 --target ./target --context-tokens 0,1024,2048 --template chat,raw --plot c.png
  eaglekit compare ./draft-31 ./draft-31-tuned --target ./Llama-3.3-70B-Instruct --engine vllm --tensor-parallel-size 8
"""


@click.command("compare", epilog=EXAMPLES)
@click.argument("draft_a")
@click.argument("draft_b")
@decode_options
@click.option("--save-report", type=click.Path(dir_okay=False), help="Also write the JSON report here.")
@click.option("--no-progress", is_flag=True, help="No progress bar on stderr.")
@click.option("--engine", type=click.Choice(RUNNERS), default=REFERENCE, show_default=True,
              help="reference: one target pass per prompt here, both drafts replayed on it; vllm: each draft served "
                   "by vLLM over every condition's first turns, paired by its per-request counters (any target "
                   "size).")
@vllm_options("--engine vllm")
@format_option
def compare_command(draft_a, draft_b, target, k, max_new_tokens, prompts_file, limit, categories, turns,
                    context_tokens, template, plot, device, dtype, target_quantization, temperature, top_p, seed,
                    save_report, no_progress, engine, engine_options, output_format):
    """Measure DRAFT_A and DRAFT_B on one target pass per prompt: τ of each and the paired difference B − A, under
    each condition (template x context length) asked for."""
    from eaglekit.decode.compare import compare_conditions, compare_in_vllm
    from eaglekit.decode.options import VerifyOptions
    from eaglekit.io.outputs import Role
    from eaglekit.plotting import check_plot_path
    from eaglekit.runtime.engine import check_engine_available, refuse_unused
    from eaglekit.verify.plot import plot_compare

    options = VerifyOptions(num_speculative_tokens=k, max_new_tokens=max_new_tokens, prompts_file=prompts_file,
                            limit=limit, categories=tuple(categories), turns=turns,
                            **conditions(context_tokens, template), device=device, dtype=dtype,
                            target_quantization=target_quantization, temperature=temperature, top_p=top_p,
                            seed=seed, outputs=(Role("--save-report", save_report or ""), Role("--plot", plot or "")),
                            engine=engine, engine_options=engine_options)
    options.check()
    if engine == REFERENCE:
        refuse_unused(engine_options, "--engine reference")
    if plot:
        check_plot_path(plot)
    given = given_paths([draft_a, draft_b, prompts_file, save_report, plot], [target])
    with ProgressLog("compare", not no_progress, given=given) as progress:
        if options.engine_only:
            check_engine_available(engine_options, progress=progress)
            served = compare_in_vllm(draft_a, draft_b, target, options, progress=progress)
            sweep, doc = served.sweep, {**served.sweep.to_dict(), "engine": served.describe()}
        else:
            sweep = compare_conditions(draft_a, draft_b, target, options, progress=progress)
            doc = sweep.to_dict()
    finish_report(doc, output_format, render, save_report=save_report,
                  draw=(lambda: plot_compare(sweep, plot)) if plot else None, given=given)


def _interval(diff: dict) -> str:
    """B − A's interval, or why there is none."""
    from eaglekit.decode.stats import too_few_text

    interval = diff["interval"]
    if diff["too_few_samples"]:
        return too_few_text(diff["samples"])
    if interval is None:
        return "—"
    return f"{interval['low']:+.3f} – {interval['high']:+.3f}"


def _rates(values: list[float]) -> str:
    return " ".join(f"{v:.2f}" for v in values)


def render(doc: dict) -> None:
    from eaglekit.decode.settings import Condition

    a, b = doc["drafts"]["a"], doc["drafts"]["b"]
    prompts = doc["prompts"]
    sweep = doc.get("conditions")
    if sweep is None:
        context = f", {prompts['context_tokens']} tokens of context" if prompts["context_tokens"] else ""
        measured = [("τ by category", doc)]
    else:
        context = f"; {len(sweep)} conditions"
        measured = [(f"τ by category: {Condition(c['template'], c['context_tokens']).label}", c) for c in sweep]
    out.print(key_value_table([
        ("A", f"{a['draft']}  (EAGLE-{a['eagle_version']}, aux ids {a['aux_layer_ids']})"),
        ("B", f"{b['draft']}  (EAGLE-{b['eagle_version']}, aux ids {b['aux_layer_ids']})"),
        ("target", doc["target"]),
        ("run", f"k={doc['num_speculative_tokens']}, {doc['max_new_tokens']} new tokens, {doc['dtype']} on "
                f"{doc['device']}; " + (doc["engine"] if doc.get("engine")
                                        else "one target pass per prompt, both drafts replayed on it")),
        ("prompts", f"{prompts['name']} ({prompts['count']} prompt turns{context})"),
        ("target numerics", quantization_text(doc.get("target_quantization"))),
        ("sampling", sampling_text(doc["sampling"], replay=True)),
        ("τ counted as", acceptance_text(doc["acceptance_settings"])),
    ], title="eaglekit compare"))
    for title, condition in measured:
        out.print()
        rows = []
        for name, row in condition["categories"].items():
            diff = row["b_minus_a"]
            rows.append([name, str(row["a"]["prompts"]), f"{row['a']['acceptance_length']:.3f}",
                         f"{row['b']['acceptance_length']:.3f}", f"{diff['acceptance_length_difference']:+.3f}",
                         _interval(diff), diff["verdict"],
                         _rates(row["a"]["per_position_acceptance"]), _rates(row["b"]["per_position_acceptance"])])
        identifier_table(title, ["category", "prompts", "τ A", "τ B", "B − A", "95 % interval", "verdict",
                                 "per position A", "per position B"], rows, prose="verdict")
    out.print("intervals: 95 % bootstrap over conversations; B − A paired (the same conversations drawn for both); "
              "per position: unconditional acceptance of each draft position", style="dim")
