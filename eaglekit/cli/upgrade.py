"""`eaglekit upgrade`: write a correct, engine-ready EAGLE-3.1 (or normalised EAGLE-3) checkpoint."""

from __future__ import annotations

import re

import click
from rich.table import Table
from rich.text import Text

from eaglekit.cli.output import (
    aux_ids,
    emit_json,
    format_option,
    given_paths,
    human_bytes,
    identifier_table,
    key_value_panel,
    out,
    print_findings,
    print_fix,
    print_prose,
    quantization_text,
    styled,
    target_path,
    target_quantization_option,
    with_given,
)
from eaglekit.cli.progress import ProgressLog
from eaglekit.errors import UsageError

EXAMPLES = """
\b
Examples:
  eaglekit upgrade --from eagle3 ./specforge-draft ./draft-31 --target ./Llama-3.1-8B-Instruct
  eaglekit upgrade ./draft ./draft-vllm --no-fc-norm --no-norm-output      # lossless: layout, ids, vocab map only
  eaglekit upgrade ./draft ./draft-31 --target ./target --fc-norm-init ones --dry-run
  eaglekit upgrade --from modelopt ./nvidia-draft ./draft-sglang --to sglang --target ./target
"""

FUNCTION_STYLE = {"preserved": "bold green", "approximate": "bold yellow", "eagle3-function": "bold yellow",
                  "warm-start": "bold red"}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?i?b?)?\s*$", re.IGNORECASE)
_UNITS = {"": 1, "b": 1, "kb": 1000, "mb": 1000**2, "gb": 1000**3, "tb": 1000**4,
          "kib": 1024, "mib": 1024**2, "gib": 1024**3, "tib": 1024**4, "k": 1000, "m": 1000**2, "g": 1000**3}


def parse_size(text: str) -> int:
    """'5GB', '500MB', '2GiB' or a byte count."""
    m = _SIZE.match(text)
    unit = (m.group(2) or "").lower() if m else None
    if not m or unit not in _UNITS:
        raise UsageError(f"--max-shard-size {text!r}: expected a size such as 5GB, 500MB or 2GiB")
    return int(float(m.group(1)) * _UNITS[unit])


@click.command("upgrade", epilog=EXAMPLES)
@click.argument("src")
@click.argument("dst")
@click.option("--from", "source_family", default="eagle3", show_default=True,
              help="eagle3 detects the source layout; or name it: eagle, sglang, specforge, speculators, modelopt, "
                   "modelopt-megatron, modelopt-vllm, torchspec, angelslim, mla, vllm.")
@click.option("--target", callback=target_path,
              help="Target model dir, its config.json, or a Hub id (through the Hugging Face cache): L, T, V, "
                   "default aux ids; with weights, hidden states for --fc-norm-init calibrated.")
@click.option("--aux-layer-ids", help="Aux layer ids, e.g. 2,16,29 (counted as --aux-convention says).")
@click.option("--aux-convention", type=click.Choice(["input", "output"]),
              help="input: input of layer i (vLLM, HF hidden_states index); output: output of layer i (SGLang, "
                   "SpecForge, ModelOpt, TorchSpec). For --aux-layer-ids, or for source ids of unknown convention.")
@click.option("--fc-norm-init", type=click.Choice(["ones", "calibrated"]),
              help="Initial weights of added fc_norm layers; switches fc_norm on [default: calibrated when the "
                   "target has weights, else ones]. ones without them: the untrained EAGLE-3.1 start.")
@click.option("--calibration-file", type=click.Path(exists=True, dir_okay=False),
              help="Text to run the target on for calibration (default: a bundled prose and code sample).")
@target_quantization_option
@click.option("--fc-norm/--no-fc-norm", default=None,
              help="Add EAGLE-3.1 per-aux RMSNorms before fc [default: on when the target has weights; off without "
                   "them and with --to gguf].")
@click.option("--norm-output/--no-norm-output", default=None,
              help="Feed the post-norm state to the next step (EAGLE-3.1) [default: as --fc-norm]. Both off: "
                   "lossless normalisation.")
@click.option("--to", "to", type=click.Choice(["vllm", "sglang", "speculators", "trtllm", "gguf"]), default="vllm",
              show_default=True, help="Output dialect (MLA drafts: vllm or sglang); gguf: one DST.gguf file for "
                                      "llama.cpp, with --target the target's GGUF (EAGLE-3 drafts only).")
@click.option("--dtype", type=click.Choice(["bf16", "fp16", "fp32"]), help="Write every float tensor in this dtype.")
@click.option("--max-shard-size", default="5GB", show_default=True, help="Shard the weights above this size.")
@click.option("--dry-run", is_flag=True, help="Print the plan (every tensor) and write nothing.")
@click.option("--force", is_flag=True, help="Replace a non-empty DST (only once the new output is complete).")
@click.option("--allow-pickle", is_flag=True, help="Read .bin/.pt sources with torch.load(weights_only=True).")
@click.option("--subfolder", help="Draft folder inside a repository that holds several drafts.")
@click.option("--revision", help="Hub revision when SRC is a repo id.")
@click.option("--device", help="Where the target runs for calibration: cpu or cuda[:N] [default: cpu].")
@click.option("--store", type=click.Path(file_okay=False),
              help="Calibrate from a hidden-state store (`eaglekit capture TARGET STORE --calibration`) instead of "
                   "running the target: --target then needs only its config, tokenizer, embeddings and head.")
@click.option("--no-progress", is_flag=True, help="No progress on stderr.")
@format_option
def upgrade_command(src, dst, source_family, target, aux_layer_ids, aux_convention, fc_norm_init, calibration_file,
                    target_quantization, fc_norm, norm_output, to, dtype, max_shard_size, dry_run, force, allow_pickle,
                    subfolder, revision, device, store, no_progress, output_format):
    """Write SRC as a correct EAGLE-3.1 draft for vLLM (or SGLang / speculators) in DST.

    With the target's weights, adds fc_norm and switches on norm_output by default, both set up to keep the
    source's function (calibrated fc_norm, the final norm rescaled into lm_head), measured on held-out text: the
    output serves at its source's acceptance, with EAGLE-3.1's flags, not yet trained as 3.1. Without them the
    default keeps EAGLE-3 (lossless) and says so; --fc-norm-init ones writes the untrained 3.1 start anyway, a
    warm start that needs `finetune`.
    --no-fc-norm --no-norm-output keeps the function exactly and only fixes layout, ids and vocabulary map.
    DST appears only when complete and validated; the source is never modified.
    """
    from eaglekit.io.dtypes import dtype_from_name
    from eaglekit.upgrade import UpgradeOptions, upgrade

    options = UpgradeOptions(
        source_family=source_family, target=target, aux_layer_ids=aux_ids(aux_layer_ids),
        aux_convention=aux_convention, fc_norm=fc_norm, norm_output=norm_output, fc_norm_init=fc_norm_init,
        calibration_file=calibration_file, target_quantization=target_quantization, to=to,
        dtype=dtype_from_name(dtype) if dtype else None,
        max_shard_size=parse_size(max_shard_size), dry_run=dry_run, force=force, allow_pickle=allow_pickle,
        subfolder=subfolder, revision=revision, device=device, store=store,
    )
    with ProgressLog("upgrade", not dry_run and not no_progress) as progress:
        report = upgrade(src, dst, options, progress=progress)
    doc = report.to_dict()
    if output_format == "json":
        emit_json(doc)
    else:
        render(with_given(doc, given_paths([src, dst, calibration_file, store], [target],
                                           resolved={doc["source"]["path"]: src, **_tuned_sibling(dst)})))


def _tuned_sibling(dst: str) -> dict[str, str]:
    """The next command's `DST-tuned`, absolute in the report → beside DST as the user typed it."""
    import os

    typed = f"{dst.rstrip('/') or dst}-tuned"
    return {f"{form}-tuned": typed for form in {os.path.abspath(dst), os.path.realpath(dst)}}


def _ids_line(aux: dict) -> Text:
    text = f"{aux['ids']} (vLLM convention) — from {aux['origin']}: {aux['detail']}"
    return styled(text) if aux["convention_known"] else styled(text, (" (convention guessed)", "yellow"))


def render(doc: dict) -> None:
    from eaglekit.engines import RECORDS
    from eaglekit.upgrade.dialects import get_dialect

    src, dst = doc["source"], doc["output"]
    engine = RECORDS[get_dialect(dst["dialect"]).ENGINE]
    style = FUNCTION_STYLE[doc["function"]]
    flags = doc["flags"]
    fc = "no"
    if flags["fc_norm"]:
        fc = f"added ({flags['fc_norm_init']} init)" if flags["fc_norm_added"] else "kept (trained)"
    no = "no"
    if flags["norm_output"]:
        no = "switched on" if flags["norm_output_added"] else "kept (trained)"
    vocab = doc["vocab"]
    residual = f"{str(flags['norm_before_residual']).lower()} ({flags['norm_before_residual_origin']})"
    rows = [
        ("source", f"{src['path']}\n{src['family']} — {src['producer']}, EAGLE-{src['eagle_version']}"),
        ("output", f"{dst['path']}\n{dst['dialect']} dialect, EAGLE-{dst['eagle_version']}, "
                   f"{human_bytes(dst['total_bytes'])}"),
        ("function", styled((doc["summary"], style))),
        ("aux layer ids", _ids_line(doc["aux"])),
        ("vocabulary", f"V={vocab['vocab_size']} Vd={vocab['draft_vocab_size']}: {vocab['detail']}"),
        ("fc_norm", fc),
        ("norm_output", no),
        ("norm_before_residual", residual),
    ]
    title = styled(("eaglekit upgrade — dry run" if doc["dry_run"] else "eaglekit upgrade", "bold"))
    key_value_panel(rows, title)
    if doc["changes"]:
        out.print(styled(("What changed in the function:", "bold")))
        for change in doc["changes"]:
            out.print(f"  • {change}")
    if doc["fidelity"]:
        _print_fidelity(doc["fidelity"])
    if doc["start"]:
        _print_rescale(doc["start"])
    _print_tensors(doc)
    shown = [f for f in doc["findings"] if f["severity"] != "info"]
    if shown:
        print_findings(shown, title="Validation of the output (no errors)")
    for warning in doc["warnings"]:
        out.print(styled(("warning:", "yellow"), f" {warning}"))
    if doc["dry_run"]:
        out.print(styled(("Dry run: nothing was written.", "bold")))
    else:
        seconds = doc["timings"].get("total_s", 0.0)
        checked = (f"read back and checked against {engine.label}'s eagle3 loader" if engine.needs_conversion
                   else f"validated for {engine.label}")
        print_prose("Wrote", f"{dst['path']} ({', '.join(dst['files'])}) in {seconds:.1f} s; {checked}.", "green")
    if doc.get("serve_command"):
        print_fix("serve: ", doc["serve_command"], style="")
    if doc["next_command"]:
        label = "serve: " if engine.needs_conversion else "next: "
        print_fix(label, doc["next_command"], style="")
    if doc["next_command"] and not engine.needs_conversion:
        out.print("  (trains the new function; until then this draft accepts fewer tokens than its source)")
    elif doc["next_step"]:
        out.print(f"next: {doc['next_step']} (until it is trained, this draft accepts fewer tokens than its source)")


def _print_fidelity(fid: dict) -> None:
    """How close the calibrated fc_norm weights bring the first step to the source, beside unit weights: the
    evidence that the calibration was worth writing."""
    served = f"; target as served in {quantization_text(fid['target_quantization'])}" \
        if fid["target_quantization"] else ""
    table = Table(title=f"First-step fc output fidelity ({fid['tokens']} held-out tokens, fit on "
                        f"{fid['fit_tokens']}, text: {fid['text']}{served})", title_justify="left")
    for col in ("fc_norm weights", "cosine", "relative error"):
        table.add_column(col)
    table.add_row("calibrated (written)", f"{fid['cosine']:.4f}", f"{fid['relative_error']:.4f}")
    table.add_row("ones (for comparison)", f"{fid['ones_cosine']:.4f}", f"{fid['ones_relative_error']:.4f}")
    out.print(table)


def _print_rescale(start: dict) -> None:
    """How well the norm_output rescale keeps the source's predictions per step, beside plain norm_output, and
    the fed-back state error no weight can remove."""
    table = Table(title=f"norm_output rescale: final norm weight {start['scale']:.4g} folded into lm_head "
                        f"({start['tokens']} held-out tokens)", title_justify="left")
    table.add_column("top-1 agreement with the source")
    for step in range(len(start["agreement"])):
        table.add_column(f"step {step + 1}", justify="right")
    table.add_row("rescaled (written)", *(f"{a:.3f}" for a in start["agreement"]))
    table.add_row("plain norm_output (for comparison)", *(f"{a:.3f}" for a in start["agreement_without_rescale"]))
    out.print(table)
    out.print(f"Fed-back state against EAGLE-3's: mean error {start['feedback_relative_error']:.1%}, 99th "
              f"percentile {start['feedback_worst']:.1%} (its per-token magnitude, which no weight can carry).")


def _print_tensors(doc: dict) -> None:
    """The whole plan on a dry run; after a write, only the tensors whose bytes or meaning changed."""
    steps = doc["tensors"] if doc["dry_run"] else [s for s in doc["tensors"] if s["action"] not in ("copy", "rename")]
    counts = ", ".join(f"{n} {a}" for a, n in doc["counts"].items() if n)
    if steps:
        step_rows = [[s["action"], s["name"] or "—", s["dtype"], str(s["shape"]),
                      "" if s["source"] in (None, s["name"]) else s["source"], s["note"]] for s in steps]
        identifier_table(f"Plan ({counts})" if doc["dry_run"] else f"Tensors ({counts}); changed:",
                         ["action", "tensor", "dtype", "shape", "source", "note"], step_rows, prose="note")
    else:
        out.print(f"Tensors: {counts}.")
