"""`eaglekit finetune`: train a draft (typically an upgrade's EAGLE-3.1 warm start) against its target."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

import click

from eaglekit.cli.output import (
    SEED,
    aux_ids,
    data_options,
    deprecated_alias,
    emit_json,
    format_option,
    given_flags,
    given_paths,
    int_list,
    key_value_table,
    out,
    print_findings,
    quantization_text,
    shell_word,
    styled,
    target_path,
    target_quantization_option,
    template_list,
    vllm_options,
    with_given,
)
from eaglekit.cli.progress import ProgressLog, training_figures
from eaglekit.finetune.evaluate import AUTO, DEFAULT_CONTEXTS, DEFAULT_TEMPLATES
from eaglekit.runner import ENGINE_ALONE, REFERENCE, RUNNERS

if TYPE_CHECKING:
    pass

EXAMPLES = """
\b
Examples:
  eaglekit upgrade ./eagle3-draft ./draft-31 --target ./SmolLM2-135M-Instruct
  eaglekit finetune ./draft-31 ./draft-31-tuned --target ./SmolLM2-135M-Instruct --generate 96 --plot
  eaglekit finetune ./draft-31 ./tuned --target ./Llama-3.1-8B-Instruct --data chats.jsonl --device cuda \\
      --steps 2000 --checkpoint-every 200
  torchrun --nproc-per-node 4 -m eaglekit finetune ./draft-31 ./tuned --target ./target --device cuda
  eaglekit finetune ./draft-31 ./tuned --target ./Kimi-K2.6 --import ./captured --captured-ids 2,30,58,61
  eaglekit finetune ./draft-31 ./tuned --target ./Llama-3.1-70B-Instruct --store ./states
"""


def _freeze(text: str) -> tuple[str, ...]:
    return () if text.strip() == "none" else tuple(v for v in text.replace(" ", "").split(",") if v)


@click.command("finetune", epilog=EXAMPLES)
@click.argument("draft")
@click.argument("out_dir", metavar="OUT")
@click.option("--target", required=True, callback=target_path,
              help="Target model: a folder (Hugging Face layout, safetensors) or a Hub id, read through the Hugging "
                   "Face cache.")
@data_options("before capturing")
@click.option("--import", "import_dir", type=click.Path(file_okay=False),
              help="Train on aux states vLLM's extract_hidden_states method wrote (a target too big for this "
                   "process); the labels are the files' own next tokens.")
@deprecated_alias("--hidden-states", "--import", "import_dir", type=click.Path(file_okay=False))
@click.option("--captured-ids", help="The eagle_aux_hidden_state_layer_ids vLLM captured into --import's files "
                                     "(default: the draft's ids).")
@click.option("--store", type=click.Path(file_okay=False),
              help="A hidden-state store written by `eaglekit capture`: train from it without loading the target's "
                   "decoder (the target folder needs only its config, tokenizer, embeddings, final norm and lm_head).")
@click.option("--max-resident-shards", type=int, default=2, show_default=True,
              help="--store: shards decoded in memory at once.")
@click.option("--soft-targets", type=int, default=0, show_default=True, metavar="K",
              help="--store: train on the target's top-K next-token probabilities (from id L) instead of its greedy "
                   "token alone (0: greedy labels).")
@click.option("--cache-dir", type=click.Path(file_okay=False),
              help="Where the target's captured states are stored, one store per target, aux ids and data, reused "
                   "by a rerun (default: $EAGLEKIT_CACHE/capture, else ~/.cache/eaglekit/capture).")
@click.option("--steps", type=int, default=100, show_default=True, help="Optimizer steps (0: only the warm start).")
@click.option("--batch-tokens", type=int, default=2048, show_default=True, help="Rows per step (global batch).")
@click.option("--depth", type=int, default=4, show_default=True, help="Unrolled draft steps (training-time test).")
@click.option("--lr", type=float, default=2e-4, show_default=True, help="Peak learning rate (AdamW).")
@click.option("--warmup-steps", type=int, help="Linear warm-up steps [default: steps / 20].")
@click.option("--depth-decay", type=float, default=0.8, show_default=True, help="Loss weight of depth j: decay^j.")
@click.option("--freeze", default="embed", show_default=True,
              help="Comma list of groups kept fixed: fc, fc_norm, input_norm, layers, head, embed (or none).")
@click.option("--precision", type=click.Choice(["auto", "bf16", "fp32"]), default="auto", show_default=True,
              help="bf16: autocast compute with fp32 master weights; auto: bf16 where the device computes it natively "
                   "(CUDA, CPUs with AVX512-BF16 or AMX), fp32 elsewhere (emulated bf16 is slower); the report "
                   "names what ran.")
@click.option("--seed", type=SEED, default=0, show_default=True)
@click.option("--warm-start", type=click.Choice(["auto", "none"]), default="auto", show_default=True,
              help="auto: before training, set up what upgrade switched on untrained (norm_output: rescale the "
                   "final norm into lm_head; unit fc_norm: least-squares fit).")
@click.option("--from-scratch", is_flag=True,
              help="Re-initialise every trained weight (keep the vocabulary map and the target-shared embedding) and "
                   "train the draft as EAGLE-3.1 from the start: the path to 3.1's gain, with a long schedule.")
@click.option("--validation-fraction", type=float, default=0.1, show_default=True,
              help="Share of the captured sequences held out to select the checkpoint (0: keep the last step).")
@click.option("--select-every", type=int, help="Score the held-out sequences every N steps [default: steps / 10].")
@click.option("--keep-unresolved", is_flag=True,
              help="Write the output even when its held-out gain over its source is not resolved (the report and "
                   "the provenance say so).")
@click.option("--device", default="cpu", show_default=True, help="cpu or cuda[:N] (under torchrun: one GPU per rank).")
@click.option("--dtype", type=click.Choice(["float32", "bfloat16", "float16"]), default="float32",
              show_default=True, help="The target's dtype for capture and evaluation.")
@deprecated_alias("--target-dtype", "--dtype", "dtype", type=click.Choice(["float32", "bfloat16", "float16"]))
@target_quantization_option
@click.option("--checkpoint-every", type=int, default=0, show_default=True,
              help="Save a resumable checkpoint every N steps (Ctrl-C always saves one).")
@click.option("--checkpoint-dir", type=click.Path(file_okay=False),
              help="Checkpoint folder [default: OUT.checkpoint, removed after a successful run].")
@click.option("--resume", is_flag=True, help="Continue from the newest checkpoint of the same run.")
@click.option("--eval-prompts", type=click.Path(dir_okay=False),
              help="Held-out prompts for τ before/after (default: verify's 16 bundled coding prompts).")
@click.option("--eval-limit", type=int, default=16, show_default=True, help="Evaluate on the first N prompts.")
@click.option("--eval-max-new-tokens", type=int, default=64, show_default=True, help="New tokens per prompt.")
@click.option("--eval-templates", default=",".join(DEFAULT_TEMPLATES), show_default=True,
              help="Templates of the held-out evaluation, the prompt shapes the draft will serve (comma list of "
                   "chat, system, raw).")
@click.option("--eval-context-tokens", default=",".join(map(str, DEFAULT_CONTEXTS)), show_default=True,
              help="Context settings of the held-out evaluation (comma list; 0 = prompts as they are).")
@click.option("-k", "--eval-k", "--num-speculative-tokens", "k", type=int, default=3, show_default=True,
              help="Draft length of the held-out evaluation and of the kept step's selection: the k you serve.")
@click.option("--eval-engine", type=click.Choice([AUTO, *RUNNERS]), default=AUTO, show_default=True,
              help="Who decodes the held-out check: reference (the target loaded here), vllm (both drafts served, "
                   "paired by vLLM's per-request counters; any target size), auto (the reference, or vLLM when a "
                   "--store run's target is too large for this device).")
@vllm_options("--eval-engine vllm")
@click.option("--no-eval", is_flag=True, help="Skip the held-out evaluation.")
@click.option("--plot", is_flag=False, flag_value="auto", default=None,
              help="Write a PNG of loss and per-depth accuracy (--plot alone: OUT-finetune.png beside OUT).")
@click.option("--force", is_flag=True, help="Replace a non-empty OUT (only once the new output is complete).")
@click.option("--no-progress", is_flag=True, help="No progress on stderr.")
@format_option
@click.pass_context
def finetune_command(ctx, draft, out_dir, target, data, import_dir, captured_ids, store, max_resident_shards,
                     soft_targets, cache_dir, steps, batch_tokens, depth, lr, warmup_steps,
                     depth_decay, freeze, precision, seed, warm_start, from_scratch, validation_fraction, select_every,
                     keep_unresolved, device, dtype, target_quantization, checkpoint_every,
                     checkpoint_dir, resume, eval_prompts, eval_limit, eval_max_new_tokens, eval_templates,
                     eval_context_tokens, k, eval_engine, engine_options,
                     no_eval, plot,
                     force, no_progress, output_format):
    """Fine-tune DRAFT against its target with EAGLE-3's training-time test; write a vLLM-ready draft to OUT.

    Self-distillation: the labels are the target's own greedy tokens, the inputs its aux hidden states (captured
    once and cached). A share of the captured sequences is held out and the step whose replayed decode τ scores
    best there is kept; the result is then paired with its source on held-out prompts (every --eval-templates and
    --eval-context-tokens condition, at -k) and written only if the pooled paired gain is resolved (interval above
    zero) and no condition is resolved worse; otherwise one line says what was measured and it exits 1
    (--keep-unresolved writes it). OUT appears only when complete and validated; the source is never modified.
    """
    import dataclasses

    from eaglekit.finetune.evaluate import EvalOptions
    from eaglekit.finetune.options import FinetuneOptions
    from eaglekit.finetune.run import finetune

    if plot == "auto":
        plot = out_dir.rstrip("/\\") + "-finetune.png"
    evaluation = EvalOptions(prompts_file=eval_prompts, limit=eval_limit, max_new_tokens=eval_max_new_tokens, k=k,
                             templates=template_list(eval_templates),
                             context_tokens=int_list(eval_context_tokens, "--eval-context-tokens", "0,1024"),
                             engine=eval_engine)
    evaluation.check()  # with --no-eval too: a bad setting is refused, not silently ignored
    _refuse_unused(ctx, no_eval, eval_engine, engine_options, store, import_dir)
    opts = FinetuneOptions(
        target=target,
        data=data, import_dir=import_dir, captured_ids=aux_ids(captured_ids, "--captured-ids"), cache_dir=cache_dir,
        eval=None if no_eval else evaluation,
        device=device, target_dtype=dtype, target_quantization=target_quantization,
        checkpoint_dir=checkpoint_dir, checkpoint_every=checkpoint_every,
        resume=resume, force=force, plot=plot, warm_start=warm_start, from_scratch=from_scratch,
        validation_fraction=validation_fraction, keep_unresolved=keep_unresolved, store=store,
        max_resident_shards=max_resident_shards, soft_targets=soft_targets,
        engine=engine_options,
    )
    opts.check()  # before torch loads with the training options
    from eaglekit.finetune.train import TrainOptions

    opts = dataclasses.replace(opts, train=TrainOptions(
        steps=steps, batch_tokens=batch_tokens, depth=depth, lr=lr, warmup_steps=warmup_steps, depth_decay=depth_decay,
        freeze=_freeze(freeze), precision=precision, seed=seed, select_every=select_every))
    main_rank = os.environ.get("RANK", "0") == "0"
    given = given_paths([draft, out_dir, data.data_file, store, import_dir, eval_prompts, cache_dir, checkpoint_dir,
                         plot], [target])
    with ProgressLog("finetune", not no_progress and main_rank, given=given) as progress:
        report = finetune(draft, out_dir, opts, progress=progress, on_step=training_figures(progress))
    if report.rank:
        return
    doc = report.to_dict()
    if output_format == "json":
        emit_json(doc)
    else:
        render(with_given(doc, given))


EVAL_FLAGS = ("--eval-prompts", "--eval-limit", "--eval-max-new-tokens", "--eval-templates", "--eval-context-tokens",
              "-k", "--eval-engine")
"""The held-out evaluation's settings: refused with --no-eval, which skips it."""


def _refuse_unused(ctx: click.Context, no_eval: bool, eval_engine: str, engine_options, store: str | None,
                   import_dir: str | None) -> None:
    """An option that this run would ignore (the evaluation's with --no-eval or --import, vLLM's where no vLLM
    decodes, the target's dtype where no target runs, the store's without --store) is refused before anything is
    read, naming both options. Those are the options whose default a value cannot tell from one given;
    FinetuneOptions.check refuses the others."""
    from eaglekit.errors import UsageError
    from eaglekit.runtime.engine import refuse_unused

    dtype = ["--dtype"] if given_flags(ctx, "--dtype") or ctx.params.get("deprecated_dtype") else []
    if no_eval:
        given = given_flags(ctx, *EVAL_FLAGS)
        if given:
            raise UsageError(f"{given[0]} with --no-eval: it sets the held-out evaluation, which --no-eval skips; "
                             f"drop one of them")
        refuse_unused(engine_options, "--no-eval")
        if store and dtype:
            raise UsageError("--dtype with --no-eval: with --store it is the dtype the held-out evaluation runs the "
                             "target in, which --no-eval skips; drop one of them")
    elif import_dir and eval_engine != ENGINE_ALONE:  # --eval-engine vllm: FinetuneOptions says how to measure it
        given = given_flags(ctx, *EVAL_FLAGS)
        if given:
            raise UsageError(f"{given[0]} with --import: it sets the held-out evaluation, which needs the target "
                             "loaded here, and --import never loads it (the output is written unmeasured); drop "
                             f"{given[0]}")
    elif eval_engine == REFERENCE:
        refuse_unused(engine_options, "--eval-engine reference")
    if import_dir:
        refuse_unused(engine_options, "--import")
        if dtype:
            raise UsageError("--dtype with --import: it is the target's dtype for capture and evaluation, and "
                             "--import runs neither (its files hold states vLLM computed); drop --dtype")
    if not store and given_flags(ctx, "--max-resident-shards"):
        raise UsageError("--max-resident-shards without --store: it bounds the store's shards in memory; give "
                         "--store, or drop --max-resident-shards")


def _tau(entry: dict) -> str:
    rates = " ".join(f"{r:.2f}" for r in entry["per_position_acceptance"])
    return f"{entry['acceptance_length']:.3f}  ({rates})"


def _difference(p: dict):
    from eaglekit.decode.stats import too_few_text

    span = (f", {too_few_text(p['samples'])}" if p["too_few_samples"]
            else f" [{p['interval']['low']:+.3f}, {p['interval']['high']:+.3f}]" if p["interval"] else "")
    style = {"better": "green", "worse": "red"}.get(p["verdict"], "")
    return styled((f"{p['acceptance_length_difference']:+.3f}{span}", style))


def render(doc: dict) -> None:
    training, data = doc["training"], doc["data"]
    last = training["history"][-1] if training["history"] else None
    resumed = f", resumed at step {training['resumed_from']}" if training["resumed_from"] is not None else ""
    rows = [
        ("source", f"{doc['source']['path']}  (EAGLE-{doc['source']['eagle_version']})"),
        ("output", doc["output"]["path"]),
        ("target", doc["target"]),
        ("target numerics", quantization_text(doc.get("target_quantization"))),
        ("data", styled(f"{data['sequences']} sequences, {data['positions']} positions — {data['source']}",
                        ("  (cached)" if data["reused"] else "", "dim"))),
        ("training", f"{training['steps']} steps in {training['seconds']:.0f} s on {training['world_size']} "
                     f"process(es){resumed}"),
    ]
    if training.get("selected_step") is not None:
        best = next(v for v in training["validation"] if v["step"] == training["selected_step"])
        replayed = (f"decode τ {best['decode_tau']:.3f} over {best['decode_rounds']} rounds, "
                    if best.get("decode_tau") is not None else "")
        rows.append(("kept", f"step {training['selected_step']}: held-out {replayed}chain score {best['score']:.3f}, "
                             "top-1 by depth " + " ".join(f"{a:.2f}" for a in best["accuracy"])))
    if last:
        rows.append(("final", f"loss {last['loss']:.3f}, top-1 by depth "
                              + " ".join(f"{a:.2f}" for a in last["accuracy"])
                              + f", {last['tokens_per_s']:.0f} tok/s"))
    rows.append(("written", doc["written"]))
    out.print(key_value_table(rows, title="eaglekit finetune"))
    evaluation = doc["evaluation"]
    if evaluation.get("after"):
        from rich.table import Table

        out.print()
        table = Table(title=f"Held-out τ: {evaluation['prompts']}, measured by {evaluation['measured_by']}",
                      title_justify="left")
        table.add_column("template", no_wrap=True)
        table.add_column("context", justify="right", no_wrap=True)
        table.add_column("before", no_wrap=True)
        table.add_column("after", no_wrap=True)
        table.add_column("after − before (paired, 95 %)", justify="right", no_wrap=True)
        table.add_column("verdict", no_wrap=True)
        for before, after, p in zip(evaluation["before"], evaluation["after"], evaluation["paired"]):
            table.add_row(p["template"], str(p["context_tokens"]), _tau(before), _tau(after), _difference(p),
                          p["verdict"])
        overall = evaluation["overall"]
        table.add_row("all", "", f"{overall['before']:.3f}", f"{overall['after']:.3f}", _difference(overall),
                      overall["verdict"])
        out.print(table)
        if overall["resolvable"] is not None:
            out.print(f"this evaluation resolves a pooled difference of ±{overall['resolvable']:.3f} "
                      "(the paired 95 % interval's half-width)")
    warnings = [f for f in doc["findings"] if f["severity"] != "info"]
    if warnings:
        print_findings(warnings)
    for note in doc["notes"]:
        out.print(f"note: {note}")
    if doc["plot"]:
        out.print(f"plot: {doc['plot']}")
    verify = " ".join(map(shell_word, ["eaglekit", "verify", doc["output"]["path"], "--target", doc["target"]]))
    out.print(styled("next: ", (verify, "bold")), soft_wrap=True)  # a command to copy: never wrapped
