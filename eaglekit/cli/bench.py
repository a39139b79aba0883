"""`eaglekit bench`: serving throughput with and without the draft, at each concurrency, in vLLM itself."""

from __future__ import annotations

import json

import click
from rich.table import Table

from eaglekit.cli.output import (
    finish_report,
    format_option,
    int_list,
    key_value_table,
    out,
    sampling_options,
    styled,
    target_path,
)
from eaglekit.cli.progress import StageProgress
from eaglekit.decode.stats import too_few_text

EXAMPLES = """
\b
Examples:
  eaglekit bench ./draft --target ./SmolLM2-135M-Instruct --concurrency 1,2 --max-new-tokens 64
  eaglekit bench ./draft --target ./Llama-3.1-8B-Instruct --concurrency 1,4,16 --plot speedup.png
  eaglekit bench ./draft --target ./target --prompts speed_bench.jsonl --category coding --limit 80
  eaglekit bench ./draft --target ./big --tensor-parallel-size 8 --save-report bench.json
"""


@click.command("bench", epilog=EXAMPLES)
@click.argument("draft")
@click.option("--target", required=True, callback=target_path, help="Target model folder (or Hub id) vLLM serves.")
@click.option("--engine", type=click.Choice(["vllm"]), default="vllm", show_default=True,
              help="The serving engine measured.")
@click.option("--concurrency", default="1,4,16", show_default=True, metavar="C[,C...]",
              help="Concurrent requests (vLLM bench serve --max-concurrency), one measurement each.")
@click.option("-k", "--num-speculative-tokens", "k", type=int, default=3, show_default=True,
              help="Drafts per round (vLLM's num_speculative_tokens).")
@click.option("--max-new-tokens", type=int, default=256, show_default=True, help="Output tokens per request (at most).")
@click.option("--ignore-eos", is_flag=True, help="Every request generates exactly --max-new-tokens.")
@sampling_options(seed=False)
@click.option("--prompts", "prompts_file", type=click.Path(dir_okay=False),
              help="JSONL prompts ({\"prompt\": ...}, {\"messages\": [...]} or {\"text\": ...} per line) or a prepared "
                   "SPEED-Bench file (measured per category); default: the bundled coding prompts (verify's "
                   "held-out set).")
@click.option("--category", "categories", multiple=True, help="Only prompts of this category, repeatable.")
@click.option("--limit", type=int, help="Use only the first N prompts (of each category for SPEED-Bench).")
@click.option("--num-prompts", type=int,
              help="Requests per concurrency, the prompts repeated in order [default: every prompt, at least "
                   "2 x concurrency].")
@click.option("--warmups", type=int, help="Warm-up requests before each measurement [default: the concurrency].")
@click.option("--dtype", type=click.Choice(["bfloat16", "float16", "float32"]), default="bfloat16",
              show_default=True, help="The dtype vLLM serves the target and draft in.")
@click.option("--tensor-parallel-size", type=int, default=1, show_default=True,
              help="vLLM tensor parallelism for targets that do not fit one device.")
@click.option("--engine-python", help="Python of the environment that has vLLM (default: $EAGLEKIT_VLLM_PYTHON, "
                                      "else .vllm-env/bin/python of the working directory or the eaglekit checkout, "
                                      "as scripts/vllm-env.sh makes it, else this one).")
@click.option("--engine-arg", "engine_args", multiple=True, metavar="KEY=VALUE",
              help="Extra vLLM server setting, repeatable (JSON values), e.g. gpu_memory_utilization=0.8.")
@click.option("--save-report", type=click.Path(dir_okay=False), help="Also write the JSON report here (push --bench).")
@click.option("--plot", type=click.Path(dir_okay=False),
              help="Write a PNG of speed-up against concurrency (needs matplotlib: eaglekit[plot]).")
@format_option
def bench_command(draft, target, engine, concurrency, k, max_new_tokens, ignore_eos, temperature, top_p, prompts_file,
                  categories, limit, num_prompts, warmups, dtype, tensor_parallel_size, engine_python, engine_args,
                  save_report, plot, output_format):
    """Serve DRAFT's target in vLLM alone and with DRAFT, drive both with vLLM's benchmark client at each
    concurrency, and report per-user tokens/s, TPOT, TTFT, throughput, speed-up and the engine's τ."""
    from eaglekit.bench.plot import plot_bench
    from eaglekit.bench.run import BenchOptions, run_bench
    from eaglekit.io.outputs import Role
    from eaglekit.plotting import check_plot_path
    from eaglekit.runtime.engine import EngineOptions, parse_engine_args

    options = BenchOptions(
        concurrency=int_list(concurrency, "--concurrency", "1,4,16"), num_speculative_tokens=k,
        max_new_tokens=max_new_tokens, prompts_file=prompts_file, categories=tuple(categories), limit=limit,
        num_prompts=num_prompts, dtype=dtype, ignore_eos=ignore_eos, warmups=warmups, temperature=temperature,
        top_p=top_p,
        engine_options=EngineOptions(python=engine_python, tensor_parallel_size=tensor_parallel_size,
                                     engine_args=parse_engine_args(engine_args)),
        outputs=(Role("--save-report", save_report or ""), Role("--plot", plot or "")))
    options.check()
    if plot:
        check_plot_path(plot)
    with StageProgress("bench") as progress:
        progress.text("reading the draft")
        report = run_bench(draft, target, options, on_stage=progress.text)
    finish_report(report.to_dict(), output_format, render, save_report=save_report,
                  draw=(lambda: plot_bench(report, plot)) if plot else None)


def sampling_text(doc: dict) -> str:
    sampling = doc["sampling"]
    return "greedy" if sampling == "greedy" else f"temperature {sampling['temperature']:g}, top-p {sampling['top_p']:g}"


def render(doc: dict) -> None:
    e = doc["engine"]
    out.print(key_value_table([
        ("draft", doc["draft"]), ("target", doc["target"]),
        ("engine", f"vLLM {e['version']} on {e['device_type']} ({e['device_name']}), {doc['dtype']}, "
                   f"tensor parallel {e['tensor_parallel_size']}, max_model_len {e['max_model_len']}"),
        ("speculative config", json.dumps(doc["speculative_config"])),
        ("requests", f"{doc['prompts']['name']} ({doc['prompts']['count']} prompts), {sampling_text(doc)}, up to "
                     f"{doc['max_new_tokens']} new tokens{' (EOS ignored)' if doc['prompts']['ignore_eos'] else ''}; "
                     f"client: vLLM bench serve"),
    ], title="eaglekit bench"))
    per_category = any(r["category"] for r in doc["rows"])
    lead = ["category"] if per_category else []
    speed = Table(title="Speed-up per concurrency C (mean per-user output tokens/s)", title_justify="left")
    latency = Table(title="Target alone → with the draft", title_justify="left")
    for table, columns in ((speed, [*lead, "C", "alone", "draft", "speed-up", "95 %", "τ", "per position"]),
                           (latency, [*lead, "C", "tok/s p50", "tok/s p99", "TPOT ms", "TTFT ms", "total tok/s"])):
        for column in columns:
            left = column in ("category", "per position")
            table.add_column(column, no_wrap=True, justify="left" if left else "right")
    for r in doc["rows"]:
        base, spec = r["baseline"], r["speculative"]
        iv = r["speed_up_interval"]
        few = r["too_few_samples"]
        first = [*([r["category"] or ""] if per_category else []), str(r["concurrency"])]
        speed.add_row(*first, f"{base['per_user_tokens_per_s']['mean']:.1f}",
                      f"{spec['per_user_tokens_per_s']['mean']:.1f}",
                      styled((f"x{r['speed_up']:.2f}", "green" if r["speed_up"] > 1 else "bold red")),
                      too_few_text(r["samples"]) if few else f"{iv['low']:.2f}–{iv['high']:.2f}" if iv else "—",
                      "—" if r["acceptance_length"] is None else f"{r['acceptance_length']:.2f}",
                      " ".join(f"{p:.2f}" for p in r["per_position_acceptance"]))
        latency.add_row(*first, *(too_few_text(r["samples"]) if base[m][q] is None or spec[m][q] is None
                                  else f"{base[m][q]:.{d}f} → {spec[m][q]:.{d}f}" for m, q, d in (
            ("per_user_tokens_per_s", "p50", 1), ("per_user_tokens_per_s", "p99", 1), ("tpot_ms", "mean", 1),
            ("ttft_ms", "mean", 0))), f"{base['output_throughput']:.1f} → {spec['output_throughput']:.1f}")
    out.print(speed)
    out.print(latency)
    for v in doc["verdicts"]:
        out.print(styled(("verdict: ", "bold"), v["text"]))
    differing = [r for r in doc["rows"] if r["identical_outputs"] < r["requests"]]
    if doc["sampling"] != "greedy":
        out.print(f"note: sampled ({sampling_text(doc)}; requests unseeded, the server seeded 0): speed-up and τ are "
                  "one draw of their expectation, and the texts with and without the draft differ by chance")
    elif differing:
        out.print(f"note: with the draft, {sum(r['requests'] - r['identical_outputs'] for r in differing)} of "
                  f"{sum(r['requests'] for r in doc['rows'])} responses differ in text from the target alone: at "
                  f"{doc['dtype']} the engine's rounding depends on how many tokens one step verifies (verify "
                  "--engine both checks losslessness in float32)")
