"""`eaglekit compare`: two drafts of one target on the same prompts and the same captured target pass."""

from __future__ import annotations

import json

import click

from eaglekit.cli.output import (
    decode_options,
    emit_json,
    err,
    format_option,
    identifier_table,
    key_value_table,
    out,
    write_text_atomically,
)

EXAMPLES = """
\b
Examples:
  eaglekit compare ./eagle3 ./eagle3.1 --target ./SmolLM2-135M-Instruct
  eaglekit compare ./a ./b --target ./target --prompts speed-bench-qualitative.jsonl --category coding --turns all
"""


@click.command("compare", epilog=EXAMPLES)
@click.argument("draft_a")
@click.argument("draft_b")
@decode_options
@click.option("--save-report", type=click.Path(dir_okay=False), help="Also write the JSON report here.")
@click.option("--no-progress", is_flag=True, help="No progress bar on stderr.")
@format_option
def compare_command(draft_a, draft_b, target, k, max_new_tokens, prompts_file, limit, categories, turns,
                    context_tokens, device, dtype, save_report, no_progress, output_format):
    """Measure DRAFT_A and DRAFT_B on one target pass per prompt: τ of each and the paired difference B − A."""
    from eaglekit.verify.compare import compare
    from eaglekit.verify.run import VerifyOptions

    options = VerifyOptions(num_speculative_tokens=k, max_new_tokens=max_new_tokens, prompts_file=prompts_file,
                            limit=limit, categories=tuple(categories), turns=turns, context_tokens=context_tokens,
                            device=device, dtype=dtype)
    if no_progress or not err.is_terminal:
        report = compare(draft_a, draft_b, target, options)
    else:
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        with Progress(TextColumn("compare"), BarColumn(), MofNCompleteColumn(),
                      TextColumn("{task.description}", markup=False), TimeElapsedColumn(), console=err,
                      transient=True) as progress:
            task = progress.add_task("loading", total=None)
            report = compare(draft_a, draft_b, target, options,
                             on_prompt=lambda done, total, name: progress.update(task, completed=done, total=total,
                                                                                  description=name))
    doc = report.to_dict()
    if save_report:
        write_text_atomically(save_report, json.dumps(doc, indent=2) + "\n")
    if output_format == "json":
        emit_json(doc)
    else:
        render(doc)


def _interval(interval: dict | None, signed: bool = False) -> str:
    if interval is None:
        return "—"
    f = "{:+.3f}" if signed else "{:.3f}"
    return f"{f.format(interval['low'])} – {f.format(interval['high'])}"


def render(doc: dict) -> None:
    a, b = doc["drafts"]["a"], doc["drafts"]["b"]
    prompts = doc["prompts"]
    context = f", {prompts['context_tokens']} tokens of context" if prompts["context_tokens"] else ""
    out.print(key_value_table([
        ("A", f"{a['draft']}  (EAGLE-{a['eagle_version']}, aux ids {a['aux_layer_ids']})"),
        ("B", f"{b['draft']}  (EAGLE-{b['eagle_version']}, aux ids {b['aux_layer_ids']})"),
        ("target", doc["target"]),
        ("run", f"k={doc['num_speculative_tokens']}, {doc['max_new_tokens']} new tokens, {doc['dtype']} on "
                f"{doc['device']}; one target pass per prompt, both drafts replayed on it"),
        ("prompts", f"{prompts['name']} ({prompts['count']} prompt turns{context})"),
    ], title="eaglekit compare"))
    out.print()
    rows = []
    for name, row in doc["categories"].items():
        diff = row["b_minus_a"]
        rows.append([name, str(row["a"]["prompts"]), f"{row['a']['acceptance_length']:.3f}",
                     f"{row['b']['acceptance_length']:.3f}", f"{diff['acceptance_length_difference']:+.3f}",
                     _interval(diff["interval"], signed=True), diff["verdict"]])
    identifier_table("τ by category", ["category", "prompts", "τ A", "τ B", "B − A", "95 % interval", "verdict"], rows,
                     prose="verdict")
    out.print("intervals: 95 % bootstrap over conversations; B − A paired (the same conversations drawn for both)",
              style="dim")
