"""`eaglekit capture`: the target's hidden states into a resumable, sharded store that finetune and upgrade read."""

from __future__ import annotations

import click

from eaglekit.cli.output import (
    aux_ids,
    data_options,
    deprecated_alias,
    emit_json,
    format_option,
    given_flags,
    given_paths,
    human_bytes,
    key_value_table,
    out,
    target_path,
    target_quantization_option,
    vllm_options,
    with_given,
)
from eaglekit.cli.progress import ProgressLog
from eaglekit.runner import REFERENCE, RUNNERS

EXAMPLES = """
\b
Examples:
  eaglekit capture ./SmolLM2-135M-Instruct ./states --draft ./draft-31 --generate 96
  eaglekit capture ./Llama-3.1-70B-Instruct ./states --draft ./draft --data chats.jsonl --engine vllm \\
      --tensor-parallel-size 4 --store-dtype fp8
  eaglekit finetune ./draft ./tuned --target ./Llama-3.1-70B-Instruct --store ./states
  eaglekit inspect ./states
"""


@click.command("capture", epilog=EXAMPLES)
@click.argument("target", callback=target_path)
@click.argument("store")
@data_options("decoded by the engine")
@deprecated_alias("--prompts", "--data", "data_file", type=click.Path(dir_okay=False))
@click.option("--calibration", is_flag=True,
              help="Capture upgrade's calibration text (its fit and held-out sequences) for `upgrade --store`.")
@click.option("--calibration-file", type=click.Path(dir_okay=False),
              help="--calibration: this text instead of the bundled prose and code sample.")
@click.option("--calibration-tokens", type=int, default=2048, show_default=True,
              help="--calibration: tokens of the text to capture.")
@click.option("--import", "import_dir", type=click.Path(file_okay=False),
              help="Import vLLM extract_hidden_states files or hs-connectors FP8 files (one per request) instead "
                   "of running the target.")
@click.option("--captured-ids", help="--import: the eagle_aux_hidden_state_layer_ids vLLM ran with (must include "
                                     "id L, which the labels come from).")
@click.option("--draft", help="Capture the aux layer ids this draft reads.")
@click.option("--aux-layer-ids", help="Aux layer ids to capture (vLLM convention), e.g. 2,15,27 [default: the "
                                      "draft's, else the target's (2, L//2, L-3)]. Id L is always captured.")
@click.option("--engine", type=click.Choice(RUNNERS), default=REFERENCE, show_default=True,
              help="reference: the target loaded with transformers in this process; vllm: the serving engine "
                   "(tensor parallel, the served checkpoint's numerics).")
@vllm_options("--engine vllm")
@click.option("--shard-tokens", type=int, default=16384, show_default=True,
              help="Tokens per shard (whole records; a shard ends at the record that reaches this many).")
@click.option("--store-dtype", type=click.Choice(["bfloat16", "float32", "fp8"]), default="bfloat16",
              show_default=True, help="fp8: E4M3 with a float32 scale per token (half of bfloat16's bytes).")
@click.option("--device", help="--engine reference: cpu or cuda[:N] [default: cpu].")
@click.option("--dtype", type=click.Choice(["auto", "float32", "bfloat16", "float16"]), default="auto",
              show_default=True, help="--engine reference: the target's dtype (auto: bfloat16 on CUDA, float32 on the "
                                      "CPU); --engine vllm: the dtype vLLM serves it in.")
@target_quantization_option
@click.option("--force", is_flag=True, help="Replace a store of another capture (its own files only).")
@click.option("--no-progress", is_flag=True, help="No progress on stderr.")
@format_option
@click.pass_context
def capture_command(ctx, target, store, data, calibration, calibration_file, calibration_tokens, import_dir,
                    captured_ids, draft, aux_layer_ids, engine, engine_options, shard_tokens, store_dtype, device,
                    dtype, target_quantization, force, no_progress, output_format):
    """Capture TARGET's hidden states (the draft's aux ids plus id L) into STORE, shard by shard.

    Every shard and the manifest are published atomically; a killed capture rerun with the same command captures
    only what is missing and ends byte-identical to an uninterrupted run. `finetune --store` and
    `upgrade --store` read the store without loading the target's decoder.
    """
    from eaglekit.capture.run import CaptureOptions, capture_store

    opts = CaptureOptions(
        target=target, data=data, draft=draft, aux_ids=aux_ids(aux_layer_ids), engine=engine,
        tensor_parallel_size=engine_options.tensor_parallel_size,
        engine_args=tuple(sorted(engine_options.engine_args.items())), engine_python=engine_options.python,
        shard_tokens=shard_tokens,
        store_dtype=store_dtype, device=device, dtype=dtype, target_quantization=target_quantization, force=force,
        calibration=calibration, calibration_file=calibration_file, calibration_tokens=calibration_tokens,
        import_dir=import_dir, captured_ids=aux_ids(captured_ids, "--captured-ids"))
    opts.check()
    _refuse_unused(ctx, opts)
    given = given_paths([store, data.data_file, calibration_file, import_dir, draft], [target])
    with ProgressLog("capture", not no_progress, given=given) as progress:
        report = capture_store(store, opts, progress=progress)
    doc = report.to_dict()
    if output_format == "json":
        emit_json(doc)
    else:
        render(with_given(doc, given))


def _refuse_unused(ctx: click.Context, opts) -> None:
    """An option given where it cannot apply is refused before any work, naming both options (those whose default
    a value cannot tell from one given; CaptureOptions.check refuses the others)."""
    from eaglekit.errors import UsageError

    if not opts.calibration and given_flags(ctx, "--calibration-tokens"):
        raise UsageError("--calibration-tokens without --calibration: it sizes the calibration text; give "
                         "--calibration, or drop --calibration-tokens")


def render(doc: dict) -> None:
    resumed = (f"resumed after record {doc['resumed_from']}" if doc["resumed_from"] is not None
               else "new store")
    engine = doc["engine"]
    rows = [
        ("store", doc["store"]),
        ("target", doc["target"]),
        ("engine", f"{engine['name']} ({engine['version'] or 'version unknown'}), dtype {engine['dtype']}, "
                   f"numerics {engine['quantization'] or 'full precision'}"),
        ("layer ids", f"aux {doc['layer_ids']['aux']} + id L={doc['layer_ids']['last']} (vLLM convention)"),
        ("data", doc["data"]),
        ("captured", f"{doc['records']} records, {doc['tokens']:,} tokens in {doc['shards']} shard(s), "
                     f"{human_bytes(doc['bytes'])} as {doc['store_dtype']}"),
        ("this run", f"{doc['captured_records']} record(s) captured in {doc['seconds']:.1f} s; {resumed}"),
    ]
    out.print(key_value_table(rows, title="eaglekit capture"))
    for note in doc["notes"]:
        out.print(f"note: {note}")
