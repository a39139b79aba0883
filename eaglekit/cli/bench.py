"""`eaglekit bench`: serving throughput with and without the draft, at each concurrency, in vLLM itself."""

from __future__ import annotations

import json

import click
from rich.table import Table

from eaglekit.cli.output import (
    acceptance_text,
    finish_report,
    format_option,
    given_flags,
    given_paths,
    int_list,
    key_value_table,
    list_items,
    out,
    printable_doc,
    sampling_options,
    styled,
    target_path,
    vllm_options,
)
from eaglekit.cli.progress import ProgressLog
from eaglekit.decode.stats import too_few_text

EXAMPLES = """
\b
Examples:
  eaglekit bench ./draft --target ./SmolLM2-135M-Instruct --concurrency 1,2 --max-new-tokens 64
  eaglekit bench ./draft --target ./Llama-3.1-8B-Instruct --concurrency 1,4,16 --plot speedup.png
  eaglekit bench ./draft --target ./target --prompts speed_bench.jsonl --category coding --limit 80
  eaglekit bench ./draft --target ./target -k 1,3,5 --dataset-name speed_bench --dataset-path ./speed_bench --limit 8
  eaglekit bench ./draft --target ./target --input-len 1024,8192 --output-len 128 --ignore-eos --seed 7
  eaglekit bench ./draft --target ./target --request-rate 4 --burstiness 0.5 --goodput ttft:500 --goodput tpot:50
  eaglekit bench ./draft --target ./big --tensor-parallel-size 8 --save-report bench.json
  eaglekit bench ./draft --base-url http://gpu-node:8000 --baseline-url http://gpu-node:8001 --concurrency 1,8,32
  eaglekit bench ./draft --base-url http://gpu-node:8000 --input-len 1024 --output-len 256 --request-rate 4
"""


@click.command("bench", epilog=EXAMPLES)
@click.argument("draft")
@click.option("--target", callback=target_path,
              help="Target model folder (or Hub id) vLLM serves; with --base-url optional: checked against the "
                   "served model, and its tokenizer read here.")
@click.option("--base-url", metavar="URL",
              help="Measure this running vLLM server (with the draft) instead of starting one; nothing is started "
                   "or stopped.")
@click.option("--baseline-url", metavar="URL",
              help="With --base-url: the same target served without a draft, for the speed-up.")
@click.option("--api-key", envvar="OPENAI_API_KEY", show_envvar=True,
              help="Bearer token the running servers ask for; never printed or saved.")
@click.option("--engine", type=click.Choice(["vllm"]), default="vllm", show_default=True,
              help="The serving engine measured.")
@click.option("--concurrency", default="1,4,16", show_default=True, metavar="C[,C...]",
              help="Concurrent requests (vLLM bench serve --max-concurrency), one measurement each.")
@click.option("-k", "--num-speculative-tokens", "k", default="3", show_default=True, metavar="K[,K...]",
              help="Drafts per round (vLLM's num_speculative_tokens); several (1,3,5): one server each, the target "
                   "alone served once.")
@click.option("--max-new-tokens", "--output-len", "--speed-bench-output-len", "max_new_tokens", type=int, default=256,
              show_default=True,
              help="Output tokens per request (at most; exactly with --ignore-eos); --output-len and "
                   "--speed-bench-output-len are vLLM's names.")
@click.option("--input-len", metavar="N[,N...]",
              help="Random prompts of N tokens (vLLM's random dataset, seeded) instead of --prompts; several: one "
                   "input-length bucket each.")
@click.option("--request-rate", type=float, default=float("inf"), show_default=True,
              help="Requests per second vLLM's client starts (Poisson arrivals, or gamma with --burstiness); inf: "
                   "all at once, bounded by the concurrency.")
@click.option("--burstiness", type=float, default=1.0, show_default=True,
              help="Gamma shape of the arrivals at --request-rate (vLLM's): below 1 burstier, above 1 more even.")
@click.option("--goodput", multiple=True, metavar="SLO:MS",
              help="A service-level objective (ttft, tpot or e2el in ms, e.g. ttft:500 tpot:50), repeatable: the "
                   "report counts the requests meeting all of them (vLLM's --goodput).")
@click.option("--seed", type=int,
              help="Shuffles the prompts before --limit and seeds vLLM's client (random prompts, arrival times) "
                   "[default: prompts in file order, seed 0].")
@click.option("--percentiles", default="50,99", show_default=True, metavar="Q[,Q...]",
              help="Percentiles reported of every latency and of per-user tokens/s (p50 and p99 always).")
@click.option("--ignore-eos", is_flag=True, help="Every request generates exactly --max-new-tokens.")
@sampling_options(seed=False)
@click.option("--prompts", "prompts_file", type=click.Path(dir_okay=False),
              help="JSONL prompts ({\"prompt\": ...}, {\"messages\": [...]} or {\"text\": ...} per line) or a prepared "
                   "SPEED-Bench file (measured per category); default: the bundled coding prompts (verify's "
                   "held-out set).")
@click.option("--dataset-name", type=click.Choice(["speed_bench"]),
              help="Read SPEED-Bench by name as vllm bench serve does (from --dataset-path or the Hugging Face cache; "
                   "measured per category).")
@click.option("--dataset-path", metavar="DIR",
              help="SPEED-Bench's folder: <subset>.jsonl as prepared for vllm bench serve, or the dataset's parquet "
                   "files.")
@click.option("--speed-bench-dataset-subset", "subsets", default="qualitative", show_default=True,
              metavar="SUBSET[,SUBSET...]",
              help="qualitative, or throughput_1k/2k/8k/16k/32k (each an input-length bucket).")
@click.option("--category", "--speed-bench-category", "categories", multiple=True,
              help="Only prompts of this category, repeatable.")
@click.option("--limit", type=int, help="Use only the first N prompts (of each category for SPEED-Bench).")
@click.option("--num-prompts", type=int,
              help="Requests per concurrency, the prompts repeated in order [default: every prompt, at least "
                   "2 x concurrency].")
@click.option("--warmups", type=int, help="Warm-up requests before each measurement [default: the concurrency].")
@click.option("--dtype", type=click.Choice(["bfloat16", "float16", "float32"]), default="bfloat16",
              show_default=True, help="The dtype vLLM serves the target and draft in.")
@vllm_options("Servers bench starts")
@click.option("--save-report", type=click.Path(dir_okay=False), help="Also write the JSON report here (push --bench).")
@click.option("--plot", type=click.Path(dir_okay=False),
              help="Write a PNG of speed-up against concurrency (needs matplotlib: eaglekit[plot]).")
@format_option
@click.pass_context
def bench_command(ctx, draft, target, base_url, baseline_url, api_key, engine, concurrency, k, max_new_tokens,
                  input_len, request_rate, burstiness, goodput, seed, percentiles, ignore_eos, temperature, top_p,
                  prompts_file, dataset_name, dataset_path, subsets, categories, limit, num_prompts, warmups, dtype,
                  engine_options, save_report, plot, output_format):
    """Serve DRAFT's target in vLLM alone and with DRAFT (or measure servers already running: --base-url), drive
    both with vLLM's benchmark client at each concurrency, and report per-user tokens/s, TPOT, TTFT, ITL, E2EL,
    throughput, speed-up and the engine's τ."""
    from eaglekit.bench.plot import plot_bench
    from eaglekit.bench.run import SERVER_OPTIONS, BenchOptions, run_bench
    from eaglekit.errors import UsageError
    from eaglekit.io.outputs import Role
    from eaglekit.plotting import check_plot_path
    from eaglekit.redact import remember_secret

    remember_secret(api_key)
    options = BenchOptions(
        concurrency=int_list(concurrency, "--concurrency", "1,4,16"), num_speculative_tokens=int_list(k, "-k", "1,3,5"),
        max_new_tokens=max_new_tokens, prompts_file=prompts_file, categories=tuple(categories), limit=limit,
        num_prompts=num_prompts, dtype=dtype, ignore_eos=ignore_eos, warmups=warmups, temperature=temperature,
        top_p=top_p, request_rate=request_rate,
        input_len=int_list(input_len, "--input-len", "1024,4096") if input_len is not None else None,
        percentiles=_percentiles(percentiles), base_url=base_url, baseline_url=baseline_url, api_key=api_key,
        engine_options=engine_options, seed=seed, burstiness=burstiness, goodput=_slos(goodput),
        dataset_name=dataset_name, dataset_path=dataset_path, speed_bench_subsets=tuple(list_items(subsets)),
        outputs=(Role("--save-report", save_report or ""), Role("--plot", plot or "")))
    options.check()
    if dataset_name is None and given_flags(ctx, "--speed-bench-dataset-subset"):
        raise UsageError("--speed-bench-dataset-subset chooses a part of --dataset-name speed_bench: give "
                         "--dataset-name speed_bench too, or drop --speed-bench-dataset-subset")
    if base_url is not None:
        given = given_flags(ctx, *SERVER_OPTIONS)
        if given:
            raise UsageError(f"--base-url measures a server already running: {given[0]} is a setting of a server "
                             "eaglekit starts (set it where that server runs)")
        if plot and not baseline_url:
            raise UsageError("--plot draws the speed-up: without --baseline-url there is none")
    elif _typed(ctx, "api_key"):  # from $OPENAI_API_KEY it is the environment's, not this command's
        raise UsageError("--api-key without --base-url: it is the key servers already running ask for, and the "
                         "servers bench starts ask for none; drop --api-key")
    elif target is None:
        raise UsageError("--target is required unless --base-url names a running server")
    if plot:
        check_plot_path(plot)
    typed = given_paths([draft, prompts_file, save_report, plot], [target])
    with ProgressLog("bench", given=typed) as progress:
        report = run_bench(draft, target, options, progress=progress)
    finish_report(report.to_dict(), output_format, render, save_report=save_report,
                  draw=(lambda: plot_bench(report, plot)) if plot else None, given=typed)


def _typed(ctx: click.Context, name: str) -> bool:
    """Whether the parameter `name` was given on the command line (not from the environment or its default)."""
    from click.core import ParameterSource

    return ctx.get_parameter_source(name) == ParameterSource.COMMANDLINE


def _slos(values: tuple[str, ...]) -> tuple[tuple[str, float], ...]:
    """--goodput's SLOs as vLLM writes them, `name:ms`, each given on its own or several in one value."""
    from eaglekit.errors import UsageError

    slos = []
    for item in (i for value in values for i in list_items(value)):
        name, _, limit = item.partition(":")
        try:
            slos.append((name, float(limit)))
        except ValueError:
            raise UsageError(f"--goodput {item!r}: expected NAME:MS such as ttft:500 or tpot:50") from None
    return tuple(slos)


def _percentiles(value: str) -> tuple[float, ...]:
    from eaglekit.cli.output import list_items
    from eaglekit.errors import UsageError

    try:
        return tuple(float(v) for v in list_items(value))
    except ValueError:
        raise UsageError(f"--percentiles {value!r}: expected comma-separated numbers such as 50,90,99") from None


def sampling_text(doc: dict) -> str:
    sampling = doc["sampling"]
    return "greedy" if sampling == "greedy" else f"temperature {sampling['temperature']:g}, top-p {sampling['top_p']:g}"


METRICS = (("per_user_tokens_per_s", "tok/s/user", 1), ("ttft_ms", "TTFT ms", 0), ("tpot_ms", "TPOT ms", 1),
           ("itl_ms", "ITL ms", 1), ("e2el_ms", "E2EL ms", 0))
"""The latency table's rows: a report's key, its label, decimals shown."""


def _engine_text(doc: dict) -> str:
    e, servers = doc["engine"], doc.get("servers") or {"started_by_eaglekit": True}
    if servers["started_by_eaglekit"]:
        return (f"vLLM {e['version']} on {e['device_type']} ({e['device_name']}), {doc['dtype']}, tensor parallel "
                f"{e['tensor_parallel_size']}, max_model_len {e['max_model_len']}")
    return (f"vLLM {e['version'] or '(version not given)'} running at {servers['speculative_url']} serving "
            f"{servers['served_model']}, max_model_len {e['max_model_len']}; not started by eaglekit")


def _requests_text(doc: dict) -> str:
    prompts = doc["prompts"]
    buckets = prompts.get("input_len_buckets") or ([prompts["input_len"]] if prompts.get("input_len") else [])
    random_prompts = not prompts.get("count") or prompts.get("name") == "random"
    source = (f"random prompts of {', '.join(str(n) for n in buckets)} tokens" if buckets and random_prompts
              else f"{prompts['name']} ({prompts['count']} prompts)")
    rate, burstiness = doc.get("request_rate", "inf"), doc.get("burstiness", 1)
    arrivals = ("all at once" if rate == "inf" else f"{rate:g} requests/s"
                + ("" if burstiness == 1 else f", burstiness {burstiness:g}"))
    return (f"{source}, {sampling_text(doc)}, up to {doc['max_new_tokens']} new tokens"
            f"{' (EOS ignored)' if prompts['ignore_eos'] else ''}, {arrivals}, seed {doc.get('seed', 0)}; "
            "client: vLLM bench serve")


def _cell(value: float | None, decimals: int) -> str:
    return "—" if value is None else f"{value:.{decimals}f}"


def _lead_columns(rows: list[dict]) -> list[str]:
    """The columns naming a row's series before its concurrency: category, k (in a sweep), input bucket."""
    return [name for name, shown in (
        ("category", any(r["category"] for r in rows)),
        ("k", len({r.get("num_speculative_tokens") for r in rows}) > 1),
        ("input", any(r.get("input_len") for r in rows))) if shown]


def _lead_cells(row: dict, lead: list[str]) -> list[str]:
    cells = {"category": row["category"] or "", "k": str(row.get("num_speculative_tokens")),
             "input": f"{row['input_len']:,}" if row.get("input_len") else ""}
    return [cells[name] for name in lead]


def _print_goodput(doc: dict, lead: list[str], baseline: bool) -> None:
    """Requests meeting every SLO, and their rate, per row and side."""
    slos = " and ".join(f"{name} ≤ {limit:g} ms" for name, limit in doc["goodput"].items())
    table = Table(title=f"Goodput: requests with {slos} (vLLM's rule)", title_justify="left")
    for column in [*lead, "C", *(["alone good", "alone req/s"] if baseline else []), "draft good", "draft req/s"]:
        table.add_column(column, no_wrap=True, justify="left" if column == "category" else "right")
    for r in doc["rows"]:
        sides = [r["baseline"], r["speculative"]] if baseline else [r["speculative"]]
        cells = [c for side in sides for c in (f"{side['good_requests']}/{side['completed']}",
                                               f"{side['request_goodput']:.2f}")]
        table.add_row(*_lead_cells(r, lead), str(r["concurrency"]), *cells)
    out.print(table)


def _config_text(doc: dict) -> str:
    """The speculative config as vLLM was given it; in a sweep, each k named (the config shown is the largest's)."""
    text = json.dumps(doc["speculative_config"])
    swept = doc.get("num_speculative_tokens_swept") or []
    if len(swept) > 1:
        text += f", num_speculative_tokens {', '.join(str(k) for k in swept)} in turn (one server each)"
    return text


def render(doc: dict) -> None:
    doc = printable_doc(doc)  # server URLs, the served model's name and versions come from outside
    servers = doc.get("servers") or {}
    baseline = all(r["baseline"] is not None for r in doc["rows"])
    out.print(key_value_table([
        ("draft", doc["draft"]), ("target", doc["target"]), ("engine", _engine_text(doc)),
        *([("baseline", servers["baseline_url"])] if servers.get("baseline_url") else []),
        ("speculative config", _config_text(doc)), ("requests", _requests_text(doc)),
        ("τ counted as", acceptance_text(doc["acceptance_settings"])),
    ], title="eaglekit bench"))
    lead = _lead_columns(doc["rows"])
    keys = [f"p{q:g}" for q in doc.get("percentiles", [50, 99])]
    if baseline:
        speed = Table(title="Speed-up per concurrency C (mean per-user output tokens/s)", title_justify="left")
        speed_columns = [*lead, "C", "alone", "draft", "speed-up", "95 %", "τ", "per position"]
    else:
        speed = Table(title="With the draft (no baseline: no speed-up)", title_justify="left")
        speed_columns = [*lead, "C", "tok/s/user", "τ", "per position"]
    latency = Table(title="Latency and per-user output tokens/s" + (" (alone, then with the draft)" if baseline
                                                                       else ""), title_justify="left")
    runs = ["run"] if baseline else []
    for table, columns in ((speed, speed_columns), (latency, [*lead, "C", "metric", *runs, "mean", *keys])):
        for column in columns:
            left = column in ("category", "per position", "metric", "run")  # k and input are numbers
            wraps = column == "per position"  # the one column a narrow terminal folds; the others keep their header
            table.add_column(column, no_wrap=not wraps, justify="left" if left else "right",
                             min_width=None if wraps else len(column))
    few_rows = [r for r in doc["rows"] if r["too_few_samples"]]
    for r in doc["rows"]:
        base, spec = r["baseline"], r["speculative"]
        first = [*_lead_cells(r, lead), str(r["concurrency"])]
        tau = "—" if r["acceptance_length"] is None else f"{r['acceptance_length']:.2f}"
        positions = " ".join(f"{p:.2f}" for p in r["per_position_acceptance"])
        if baseline:
            iv = r["speed_up_interval"]
            speed.add_row(*first, f"{base['per_user_tokens_per_s']['mean']:.1f}",
                          f"{spec['per_user_tokens_per_s']['mean']:.1f}",
                          styled((f"x{r['speed_up']:.2f}", "green" if r["speed_up"] > 1 else "bold red")),
                          "too few" if r["too_few_samples"] else f"{iv['low']:.2f}–{iv['high']:.2f}" if iv else "—",
                          tau, positions)
        else:
            speed.add_row(*first, f"{spec['per_user_tokens_per_s']['mean']:.1f}", tau, positions)
        sides = [("alone", base), ("draft", spec)] if baseline else [("draft", spec)]
        shown = [(key, label, decimals) for key, label, decimals in METRICS if key in spec]
        for i, (key, label, decimals) in enumerate([("output_throughput", "total tok/s", 1), *shown]):
            for j, (run, figures) in enumerate(sides):
                cells = ([_cell(figures[key], decimals)] + [""] * len(keys) if key == "output_throughput" else
                         [_cell(figures[key]["mean"], decimals), *(_cell(figures[key].get(q), decimals) for q in keys)])
                latency.add_row(*(first if i == j == 0 else [""] * len(first)), label if j == 0 else "",
                                *([run] if baseline else []), *cells,
                                end_section=i == len(shown) and j == len(sides) - 1)
    out.print(speed)
    out.print(latency)
    if few_rows:
        out.print(f"too few: {too_few_text(min(r['samples'] for r in few_rows))}: no interval and no percentile "
                  "above p50 (— in the tables)")
    if doc.get("goodput"):
        _print_goodput(doc, lead, baseline)
    for v in doc["verdicts"]:
        out.print(styled(("verdict: ", "bold"), v["text"]))
    for note in doc.get("notes") or []:
        out.print(f"note: {note}")
    if not baseline:
        return
    differing = [r for r in doc["rows"] if r["identical_outputs"] < r["requests"]]
    if doc["sampling"] != "greedy":
        out.print(f"note: sampled ({sampling_text(doc)}; requests unseeded, the server seeded 0): speed-up and τ are "
                  "one draw of their expectation, and the texts with and without the draft differ by chance")
    elif differing:
        out.print(f"note: with the draft, {sum(r['requests'] - r['identical_outputs'] for r in differing)} of "
                  f"{sum(r['requests'] for r in doc['rows'])} responses differ in text from the target alone: at "
                  f"{doc['dtype'] or 'a reduced precision'} the engine's rounding depends on how many tokens one "
                  "step verifies (verify --engine both checks losslessness in float32)")
