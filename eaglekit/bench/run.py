"""`eaglekit bench`: a drafter's serving speed-up in the engine that serves it, at each concurrency asked for.

vLLM's OpenAI-compatible server runs twice on the same target, settings and requests: the target alone, then with
the draft under the speculative config the model card prints. vLLM's own benchmark client drives each at every
concurrency (a warm-up first, outside the measurement); acceptance comes from the server's spec-decode counters.
The draft is read and checked against the target first, so a draft that cannot load costs seconds, not two server
starts. Targets too big for one device use vLLM's tensor parallelism (--tensor-parallel-size).

A sweep of k (-k 1,3,5) starts the target alone once and the target with the draft once per k, each measured on
the same requests; input-length buckets (--input-len 1024,4096, or SPEED-Bench's throughput subsets) are measured
each on its own, as are SPEED-Bench's categories. Refused before any server starts: a bucket past the target's
context.

A deployment that already runs (--base-url, and --baseline-url for its no-spec twin) is measured as it is: eaglekit
starts and stops nothing, reads what the server serves from its own routes, and its acceptance from the difference
of its counters around each measurement.
"""

from __future__ import annotations

import json
import math
import os
import random
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from eaglekit.bench import datasets
from eaglekit.bench.report import (
    GOODPUT_METRICS,
    LATENCIES,
    REPORTED_PERCENTILES,
    BenchReport,
    BenchRow,
    ServedRun,
    chosen_percentiles,
    percentile_key,
)
from eaglekit.decode.prompts import Prompt, PromptSet, encode, render_text
from eaglekit.decode.sampling import Sampling
from eaglekit.decode.stats import MIN_SAMPLES
from eaglekit.engines.vllm import acceptance_settings, speculative_config
from eaglekit.errors import EngineError, UsageError
from eaglekit.io.outputs import Role
from eaglekit.io.urls import check_http_url
from eaglekit.progress import Progress, quiet
from eaglekit.provenance import measured_files
from eaglekit.redact import public_flags, public_path
from eaglekit.runtime.endpoint import PER_POSITION, Endpoint, ServedModel, counted_between
from eaglekit.runtime.engine import EngineOptions, check_engine_available, fitted_model_len
from eaglekit.runtime.server import BenchClient, Server, engine_flags, start_server

DEFAULT_CONCURRENCY = (1, 4, 16)
MAX_REQUESTS = 100_000  # per concurrency: each is a dataset row written before the client starts
MAX_CONCURRENCY = 4096  # vLLM's max_num_seqs is the highest one
PERCENTILE_METRICS = ",".join(LATENCIES)
RANDOM_REQUESTS = MIN_SAMPLES  # requests per concurrency of random prompts, at least (enough for a p99)
SERVER_OPTIONS = ("-k", "--dtype", "--tensor-parallel-size", "--engine-arg")
"""Settings of a server eaglekit starts: meaningless for a running one (--base-url), so refused with it."""


@dataclass(frozen=True)
class BenchOptions:
    concurrency: tuple[int, ...] = DEFAULT_CONCURRENCY
    num_speculative_tokens: int | tuple[int, ...] = 3  # several: one server per k (a sweep)
    max_new_tokens: int = 256
    prompts_file: str | None = None
    categories: tuple[str, ...] = ()
    limit: int | None = None  # first N prompts (of each category, for a SPEED-Bench file)
    num_prompts: int | None = None  # requests per concurrency; default: every prompt, at least 2 x concurrency
    dtype: str = "bfloat16"
    ignore_eos: bool = False  # every request generates max_new_tokens
    temperature: float = 0.0  # every request's; 0: greedy
    top_p: float = 1.0
    warmups: int | None = None  # warm-up requests before each measurement; default: the concurrency
    engine_options: EngineOptions = EngineOptions()
    start_timeout_s: float = 1800.0
    outputs: tuple[Role, ...] = field(default=())  # what the caller writes (--save-report, --plot)
    request_rate: float = math.inf  # requests/s vLLM's client starts (inf: all at once, bounded by the concurrency)
    input_len: int | tuple[int, ...] | None = None  # random prompts of this many tokens (vLLM's random dataset)
    # instead of prompts; several: one bucket each
    percentiles: tuple[float, ...] = REPORTED_PERCENTILES  # asked for besides p50 and p99
    base_url: str | None = None  # a running speculative server: nothing is started
    baseline_url: str | None = None  # its running no-spec twin
    api_key: str | None = field(default=None, repr=False)  # the servers' key (Authorization: Bearer), never shown
    seed: int | None = None  # the prompts' order and vLLM's client's seed; None: prompts in file order, seed 0
    burstiness: float = 1.0  # gamma shape of the arrivals at --request-rate (vLLM's --burstiness; 1: Poisson)
    goodput: tuple[tuple[str, float], ...] = ()  # (ttft|tpot|e2el, SLO in ms), vLLM's --goodput
    dataset_name: str | None = None  # "speed_bench": SPEED-Bench read by name (eaglekit.bench.datasets)
    dataset_path: str | None = None  # its folder; default: the Hugging Face cache
    speed_bench_subsets: tuple[str, ...] = ("qualitative",)

    @property
    def ks(self) -> tuple[int, ...]:
        k = self.num_speculative_tokens
        return (k,) if isinstance(k, int) else tuple(k)

    @property
    def input_lens(self) -> tuple[int, ...]:
        n = self.input_len
        return () if n is None else (n,) if isinstance(n, int) else tuple(n)

    @property
    def client_seed(self) -> int:
        return 0 if self.seed is None else self.seed

    @property
    def slo_ms(self) -> dict[str, float] | None:
        return dict(self.goodput) if self.goodput else None

    @property
    def sampling(self) -> Sampling:
        return Sampling(self.temperature, self.top_p)

    @property
    def chosen_percentiles(self) -> tuple[float, ...]:
        return chosen_percentiles(self.percentiles)

    def check(self) -> None:
        self.engine_options.check()
        self.sampling.check()
        if self.baseline_url and not self.base_url:
            raise UsageError("--baseline-url measures the twin of a running speculative server: give that one as "
                             "--base-url")
        for option, url in (("--base-url", self.base_url), ("--baseline-url", self.baseline_url)):
            if url is not None:
                check_http_url(url, option, "http://gpu-node:8000")
        if not (self.request_rate > 0):
            raise UsageError(f"--request-rate {self.request_rate:g}: expected a positive number of requests/s, or inf")
        if any(not 0 < q < 100 for q in self.percentiles) or len(set(self.percentiles)) != len(self.percentiles):
            raise UsageError("--percentiles takes distinct numbers between 0 and 100, e.g. 50,90,99")
        self._check_prompts()
        self._check_load()
        if not self.concurrency or any(c < 1 for c in self.concurrency):
            raise UsageError("--concurrency takes positive integers, e.g. 1,4,16")
        if len(set(self.concurrency)) != len(self.concurrency):
            raise UsageError("--concurrency lists a value twice")
        if max(self.concurrency) > MAX_CONCURRENCY:
            raise UsageError(f"--concurrency {max(self.concurrency)}: at most {MAX_CONCURRENCY}")
        for name, value in (("--num-prompts", self.num_prompts), ("--warmups", self.warmups)):
            if value is not None and value > MAX_REQUESTS:
                raise UsageError(f"{name} {value:,}: at most {MAX_REQUESTS:,} per concurrency")
        for name, value in (("-k", min(self.ks or (0,))), ("--max-new-tokens", self.max_new_tokens),
                            ("--limit", self.limit), ("--num-prompts", self.num_prompts)):
            if value is not None and value < 1:
                raise UsageError(f"{name} must be at least 1")
        if self.warmups is not None and self.warmups < 0:
            raise UsageError("--warmups cannot be negative")
        if self.dtype not in ("bfloat16", "float16", "float32"):
            raise UsageError(f"--dtype {self.dtype!r}: use bfloat16, float16 or float32")

        if len(set(self.ks)) != len(self.ks):
            raise UsageError("-k lists a value twice")
        given = self.engine_options.engine_args.get("max_model_len")
        if given is not None and (type(given) is not int or given < 1):
            raise UsageError(f"--engine-arg max_model_len={given!r}: expected a positive integer")

    def _check_prompts(self) -> None:
        """Where the prompts come from: one source, buckets distinct and positive."""
        lens = self.input_lens
        if any(n < 1 for n in lens) or len(set(lens)) != len(lens):
            raise UsageError("--input-len takes distinct positive token counts, e.g. 1024,4096")
        if self.dataset_path is not None and self.dataset_name is None:
            raise UsageError("--dataset-path names the folder of --dataset-name speed_bench")
        if self.dataset_name is not None:
            if self.dataset_name not in datasets.DATASET_NAMES:
                raise UsageError(f"--dataset-name {self.dataset_name!r}: use one of "
                                 f"{', '.join(datasets.DATASET_NAMES)} (or --prompts FILE)")
            datasets.check_subsets(self.speed_bench_subsets)
            if self.prompts_file or lens:
                raise UsageError(f"--dataset-name {self.dataset_name} chooses the prompts: "
                                 f"{'--prompts' if self.prompts_file else '--input-len'} too, use one or the other")
        if lens:
            selecting = [name for name, value in (("--prompts", self.prompts_file), ("--category", self.categories),
                                                  ("--limit", self.limit)) if value]
            if selecting:
                raise UsageError(f"--input-len draws random prompts (vLLM's random dataset): {selecting[0]} selects "
                                 "prompts, use one or the other")

    def _check_load(self) -> None:
        """The arrivals and the SLOs, as vLLM's client takes them."""
        if self.seed is not None and self.seed < 0:
            raise UsageError("--seed must be a non-negative integer")
        if not (self.burstiness > 0):
            raise UsageError(f"--burstiness {self.burstiness:g}: expected a positive number (1: Poisson arrivals)")
        if self.burstiness != 1 and math.isinf(self.request_rate):
            raise UsageError("--burstiness shapes the arrivals at a --request-rate: with inf every request starts at "
                             "once")
        names = [name for name, _ in self.goodput]
        for name, limit in self.goodput:
            if name not in GOODPUT_METRICS:
                raise UsageError(f"--goodput {name}: an SLO is one of {', '.join(GOODPUT_METRICS)} (in ms)")
            if not (0 <= limit < math.inf):
                raise UsageError(f"--goodput {name}:{limit:g}: expected a non-negative number of ms")
        if len(set(names)) != len(names):
            raise UsageError("--goodput names an SLO twice")

    def requests(self, prompts: int, concurrency: int) -> int:
        """Requests per concurrency: --num-prompts, else every prompt and at least 2 x concurrency (random prompts:
        at least RANDOM_REQUESTS)."""
        return self.num_prompts or max(prompts or RANDOM_REQUESTS, 2 * concurrency)


@dataclass(frozen=True)
class PromptGroup:
    """Prompts measured together: a SPEED-Bench category, or the whole set (category None), in an input-length
    bucket (`input_len`: random prompts of that length when `texts` is empty, else a throughput subset's)."""

    category: str | None
    texts: tuple[str, ...]
    input_len: int | None = None

    @property
    def key(self) -> tuple[int | None, str | None]:
        return (self.input_len, self.category)


CLIENT_STAGE = "starting vLLM's benchmark client (vllm bench serve)"
"""The stage of the client's start: it imports vLLM and pandas, tens of seconds on a CPU."""


def run_bench(draft: str, target: str | None, options: BenchOptions,
              progress: Progress | None = None) -> BenchReport:
    """Measure `draft` against `target` in vLLM at every concurrency of `options`; see the module docstring. With
    `options.base_url` the servers are already running (`_bench_running`) and `target` may be None. `progress`
    hears of each server start and each measured run as a stage."""
    options.check()
    say = quiet(progress).stage
    if options.base_url:
        say("reading the draft")
        return _bench_running(draft, target, options, say)
    if target is None:
        raise UsageError("--target is required unless --base-url names a running server")
    from eaglekit.decode.options import VerifyOptions
    from eaglekit.decode.setup import decode_setup

    engine = options.engine_options
    check_engine_available(engine, progress=progress)
    say("reading the draft and the target's tokenizer")
    ks = options.ks
    named = options.dataset_name is None
    verify_options = VerifyOptions(num_speculative_tokens=max(ks), max_new_tokens=options.max_new_tokens,
                                   prompts_file=options.prompts_file,
                                   categories=options.categories if named else (), dtype=options.dtype,
                                   engine="vllm", engine_options=engine, outputs=options.outputs)
    setup = decode_setup([("draft", draft)], target, verify_options, load_model=False)
    (checked,) = setup.drafts
    prompts = setup.prompts if named and not options.input_lens else None  # random prompts: none of these
    groups, longest = _groups(prompts, setup.tokenizer, options)
    context = setup.info.max_position_embeddings
    model_len = engine.engine_args.get("max_model_len") or fitted_model_len(longest, options.max_new_tokens, max(ks),
                                                                            context)
    _refuse_buckets_past(options, max(ks), model_len if engine.engine_args.get("max_model_len") else context)
    _refuse_past_model_len(longest, options.max_new_tokens, max(ks), model_len)
    target_path = os.path.abspath(target)
    base_settings = {"tokenizer": target_path, "dtype": options.dtype, "max_model_len": model_len,
                     "max_num_seqs": max(options.concurrency), "seed": 0,
                     "tensor_parallel_size": engine.tensor_parallel_size, **engine.llm_args}
    configs = {k: speculative_config(os.path.abspath(checked.path), k, engine.speculative_settings) for k in ks}
    report = BenchReport(
        checked.path, target, checked.spec.eagle_version, max(ks), options.max_new_tokens, options.dtype,
        _prompts_block(_prompts_name(prompts, options), groups, options), {}, configs[max(ks)],
        measured_files(checked.spec, setup.info), sampling=options.sampling, request_rate=options.request_rate,
        percentiles=options.chosen_percentiles,
        acceptance_settings=acceptance_settings(engine.speculative_settings, sampled=not options.sampling.greedy),
        swept=ks, seed=options.client_seed, burstiness=options.burstiness, goodput=options.slo_ms)
    sides = [("target alone", "baseline", base_settings)] + [
        (f"target + draft, k={k}" if len(ks) > 1 else "target + draft",
         f"speculative_k{k}" if len(ks) > 1 else "speculative", {**base_settings, "speculative_config": configs[k]})
        for k in ks]
    started = time.perf_counter()
    runs = _serve_sides(sides, report, groups, options, target_path, say)
    report.timings["total_s"] = time.perf_counter() - started
    alone = runs["baseline"]
    report.rows = [BenchRow(c, g.category, alone[(g.key, c)], runs[key][(g.key, c)], k, g.input_len)
                   for k, (_, key, _) in zip(ks, sides[1:]) for g in groups for c in options.concurrency]
    return report


def _serve_sides(sides: Sequence[tuple[str, str, dict[str, Any]]], report: BenchReport,
                 groups: Sequence[PromptGroup], options: BenchOptions, target_path: str,
                 say: Callable[[str], None]) -> dict[str, dict[tuple[Any, int], ServedRun]]:
    """Start each side's server in turn (never two at once), measure every group and concurrency on it, stop it;
    each side's runs under its key ("baseline", "speculative" or "speculative_k<k>"). The report gets each
    server's flags and start time, and the engine's identity."""
    engine = options.engine_options
    model_len = sides[0][2]["max_model_len"]
    runs: dict[str, dict[tuple[Any, int], ServedRun]] = {}
    say(CLIENT_STAGE)
    with tempfile.TemporaryDirectory(prefix="eaglekit-bench-") as work, \
            BenchClient(engine.interpreter, work, None) as client:
        files = _datasets(work, groups, options)
        for side, key, settings in sides:
            say(f"{side}: starting vLLM")
            server = start_server(engine.interpreter, work, side,
                                  argv=["--model", target_path, *engine_flags(settings)], target=target_path,
                                  dtype=options.dtype, positions=model_len * max(options.concurrency),
                                  given=list(engine.llm_args), timeout_s=options.start_timeout_s)
            try:
                runs[key] = _measure_side(client, server.endpoint, side, files, groups, options,
                                          model=target_path, tokenizer=target_path, say=say, notes=report.notes,
                                          server=server)
            finally:
                server.stop()
            report.timings[f"{key}_start_s"] = server.start_s
            report.engine.setdefault("server_args", {})[key] = public_flags(server.flags)
            report.engine.update(name="vllm", version=server.info.get("vllm_version"),
                                 device_type=server.info.get("device_type"),
                                 device_name=server.info.get("device_name"),
                                 tensor_parallel_size=engine.tensor_parallel_size, max_model_len=model_len,
                                 max_num_seqs=max(options.concurrency), memory_sizing=server.info.get("sized") or None,
                                 cpu_kv_cache_gib=server.info.get("kv_cache_gib_cpu"),
                                 client="vllm bench serve", endpoint="/v1/completions")
    return runs


def _refuse_buckets_past(options: BenchOptions, k: int, limit: int | None) -> None:
    """A random-prompt bucket that cannot fit the target's context (or the max_model_len given) is refused before
    any server starts, naming the bucket."""
    for bucket in options.input_lens:
        if limit and bucket + options.max_new_tokens + k > limit:
            raise UsageError(f"--input-len {bucket}: {bucket:,} prompt tokens, {options.max_new_tokens:,} new ones "
                             f"and {k} drafts exceed the target's max_model_len {limit:,}")


def _bench_running(draft: str, target: str | None, options: BenchOptions, say: Callable[[str], None]) -> BenchReport:
    """bench against servers already running (`--base-url`, `--baseline-url`): nothing is started or stopped. The
    served model and its context come from /v1/models, k from the per-position counters, and acceptance from the
    differences of /metrics readings around each measurement."""
    speculative = Endpoint(options.base_url or "", "speculative server", options.api_key)
    baseline = Endpoint(options.baseline_url, "baseline server", options.api_key) if options.baseline_url else None
    served = speculative.served_model()
    counters = speculative.counters()
    if counters is None:
        raise EngineError(f"the speculative server at {speculative.public_url} exposes no spec-decode counters at "
                          "/metrics (vllm:spec_decode_*): it serves without a draft; start it with "
                          "--speculative-config, or measure it as --baseline-url")
    k = len(counters.accepted_per_position)
    if not k:
        raise EngineError(f"the speculative server at {speculative.public_url} exposes no per-position acceptance "
                          f"counter ({PER_POSITION}), so its k cannot be told (a vLLM too old to export it)")
    if baseline is not None:
        twin = baseline.served_model()
        if twin.id != served.id:
            raise EngineError(f"the baseline server at {baseline.public_url} serves {twin.id!r}, the speculative one "
                              f"{served.id!r}: a speed-up needs the same model both ways")
        if baseline.counters() is not None:
            raise EngineError(f"the baseline server at {baseline.public_url} speculates (its /metrics has "
                              "vllm:spec_decode_* counters): the baseline is the target served without a draft")
    if target is not None and not _same_model(target, served):
        raise EngineError(f"the speculative server at {speculative.public_url} serves {served.id!r}, not the "
                          f"--target {public_path(target)!r}")
    engine = options.engine_options
    source = _tokenizer_source(target) if target is not None else (served.root or served.id)
    # random prompts are drawn and counted by vLLM's client alone; named prompts are rendered and bounded here
    tokenizer = None if options.input_lens else _served_tokenizer(source, served.max_model_len)
    from eaglekit.decode.options import VerifyOptions
    from eaglekit.decode.setup import refuse_clobbered_inputs, select_prompts

    named = options.dataset_name is None
    verify_options = VerifyOptions(max_new_tokens=options.max_new_tokens, prompts_file=options.prompts_file,
                                   categories=options.categories if named else (), outputs=options.outputs)
    refuse_clobbered_inputs(verify_options, [("DRAFT", draft)] if os.path.isdir(draft) else [], target or "")
    prompts = select_prompts(verify_options) if named and not options.input_lens else None
    groups, longest = _groups(prompts, tokenizer, options)
    _refuse_buckets_past(options, k, served.max_model_len)
    if served.max_model_len:
        _refuse_past_model_len(longest, options.max_new_tokens, k, served.max_model_len)
    notes = ["τ and per-position acceptance are the differences of the speculative server's counters read before "
             "and after each measurement: whatever else it served meanwhile is counted too"]
    if baseline is None:
        notes.append("no baseline server (--baseline-url): no speed-up and no verdict, only the speculative "
                     "server's τ, latencies and throughput")
    report = BenchReport(
        draft, target or served.id, None, k, options.max_new_tokens, None,
        _prompts_block(_prompts_name(prompts, options), groups, options),
        {"name": "vllm", "version": speculative.version(), "device_type": None, "device_name": None,
         "tensor_parallel_size": None, "max_model_len": served.max_model_len, "max_num_seqs": None,
         "memory_sizing": None, "cpu_kv_cache_gib": None, "client": "vllm bench serve",
         "endpoint": "/v1/completions", "server_args": {"baseline": [], "speculative": []}},
        {"model": draft, "method": "eagle3", "num_speculative_tokens": k}, None, sampling=options.sampling,
        request_rate=options.request_rate, percentiles=options.chosen_percentiles,
        servers={"started_by_eaglekit": False, "speculative_url": speculative.public_url,
                 "baseline_url": baseline.public_url if baseline else None, "served_model": served.id},
        notes=notes, acceptance_settings=acceptance_settings(None, source="the running server's own: eaglekit did "
                                                                          "not start it"),
        seed=options.client_seed, burstiness=options.burstiness, goodput=options.slo_ms)
    started = time.perf_counter()
    runs: dict[str, dict[tuple[Any, int], ServedRun]] = {}
    say(CLIENT_STAGE)
    with tempfile.TemporaryDirectory(prefix="eaglekit-bench-") as work, \
            BenchClient(engine.interpreter, work, options.api_key) as client:
        files = _datasets(work, groups, options)
        for side, endpoint in (("target alone", baseline), ("target + draft", speculative)):
            if endpoint is not None:
                runs[side] = _measure_side(client, endpoint, side, files, groups, options, model=served.id,
                                           tokenizer=source, say=say, notes=report.notes)
    report.timings["total_s"] = time.perf_counter() - started
    alone, drafted = runs.get("target alone"), runs["target + draft"]
    report.rows = [BenchRow(c, g.category, alone[(g.key, c)] if alone else None, drafted[(g.key, c)], k, g.input_len)
                   for g in groups for c in options.concurrency]
    return report


def _measure_side(client: BenchClient, endpoint: Endpoint, side: str, files: dict[tuple[Any, int], str | None],
                  groups: Sequence[PromptGroup], options: BenchOptions, *, model: str, tokenizer: str,
                  say: Callable[[str], None], notes: list[str],
                  server: Server | None = None) -> dict[tuple[Any, int], ServedRun]:
    """Every concurrency and group on one server: warm-ups first (outside the measurement), then the server's
    counters, vLLM's client, the counters again; acceptance is the difference of the two readings. Where that
    difference is unknown (counters absent or reset), a note in `notes` says so and those rows carry no τ."""
    engine = options.engine_options
    unknown_at: dict[str, list[str]] = {}
    body = {"max_tokens": options.max_new_tokens, "temperature": options.temperature,
            **({"top_p": options.top_p} if options.top_p < 1 else {}),
            **({"ignore_eos": True} if options.ignore_eos else {})}
    measured = {}
    for group in groups:
        for c in options.concurrency:
            label = ", ".join([f"C={c}", *([f"{group.input_len:,} input tokens"] if group.input_len else []),
                               *([group.category] if group.category else [])])
            say(f"{side}: {label}")
            warmups = c if options.warmups is None else options.warmups
            # random prompts: token ids of the same length (ids 1000-1999, within any real vocabulary)
            warm_prompt = group.texts[0] if group.texts else [1000 + i % 1000 for i in range(group.input_len or 1)]
            endpoint.warm_up(model, warm_prompt, warmups, c, body, timeout_s=engine.timeout_s)
            before = endpoint.counters()
            args = _client_args(model, files[(group.key, c)], c, options, input_len=group.input_len,
                                tokenizer=tokenizer)
            result = client.run(endpoint, args, what=label, timeout_s=engine.timeout_s, server=server)
            counters, unknown = counted_between(before, endpoint.counters())
            if unknown and side != "target alone":  # the speculative side, one k or each of a sweep
                unknown_at.setdefault(unknown, []).append(label)
            measured[(group.key, c)] = ServedRun.from_vllm(result, counters, options.chosen_percentiles,
                                                           options.slo_ms)
    sweep_k = side.removeprefix("target + draft").lstrip(", ")  # "k=3" in a sweep, else ""
    notes.extend(f"τ unknown at {', '.join(f'{sweep_k}, {label}' if sweep_k else label for label in labels)}: the "
                 f"speculative server's spec-decode counters were {reason}" for reason, labels in unknown_at.items())
    return measured


def _same_model(target: str, served: ServedModel) -> bool:
    """Whether --target names the model the server serves: the same Hub id, or the same folder name (the server
    may have loaded it from another path on its own machine)."""
    mine = {target, str(public_path(_tokenizer_source(target)))}
    theirs = {name for name in (served.id, served.root) if name}
    return bool(mine & (theirs | {str(public_path(name)) for name in theirs}))


def _tokenizer_source(target: str) -> str:
    """The folder of a local --target given as its config.json; a folder or Hub id as it is."""
    return os.path.dirname(target) if os.path.isfile(target) else target


def _served_tokenizer(source: str, max_model_len: int | None):
    """The served model's tokenizer, read here for the chat template and token counts (as vLLM's client reads it):
    from --target, else from the root /v1/models names (a Hub id through the cache, or a path on this machine)."""
    from eaglekit.target_model import quiet_transformers

    with quiet_transformers():
        from transformers import AutoTokenizer

        try:
            tokenizer = AutoTokenizer.from_pretrained(source)
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise UsageError(f"cannot load the served model's tokenizer from {public_path(source)!r} "
                             f"({str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__}): pass --target "
                             "with a local copy of the target (its tokenizer files are enough)") from None
    if max_model_len:
        tokenizer.model_max_length = max_model_len
    return tokenizer


def _refuse_past_model_len(longest: int, new_tokens: int, k: int, model_len: int) -> None:
    if longest + new_tokens + k > model_len:
        raise UsageError(f"the longest prompt's {longest:,} tokens, {new_tokens:,} new ones and {k} drafts "
                         f"exceed max_model_len {model_len:,}")


def _prompts_name(prompts: PromptSet | None, options: BenchOptions) -> str:
    if options.dataset_name is not None:
        return f"SPEED-Bench {', '.join(options.speed_bench_subsets)}"
    return prompts.name if prompts else "random"


def _prompts_block(name: str, groups: Sequence[PromptGroup], options: BenchOptions) -> dict:
    count = sum(len(g.texts) for g in groups) or options.requests(0, max(options.concurrency))
    lens = options.input_lens
    buckets = sorted({g.input_len for g in groups if g.input_len is not None})
    return {"name": name, "count": count, "speed_bench": any(g.category for g in groups),
            "categories": list(dict.fromkeys(g.category for g in groups if g.category is not None)),
            "ignore_eos": options.ignore_eos, "input_len": lens[0] if len(lens) == 1 else None,
            "input_len_buckets": buckets, "dataset_name": options.dataset_name,
            "speed_bench_subsets": list(options.speed_bench_subsets) if options.dataset_name else [],
            "shuffled_with_seed": options.seed is not None or options.dataset_name is not None}


def _groups(prompts: PromptSet | None, tokenizer, options: BenchOptions) -> tuple[list[PromptGroup], int]:
    """The prompts as the server receives them, grouped (by category for SPEED-Bench, and by input-length bucket),
    the first --limit of each (after a shuffle with --seed, when one is given or SPEED-Bench is read by name); and
    the longest one in target tokens (checked against the target's context as verify checks it). Random prompts
    (--input-len) are one group of no texts per bucket: vLLM's client draws them."""
    if options.input_lens:
        return [PromptGroup(None, (), n) for n in options.input_lens], max(options.input_lens)
    if options.dataset_name is not None:
        subsets = [datasets.read_subset(options.dataset_path, subset, options.categories, options.client_seed)
                   for subset in options.speed_bench_subsets]
        batches = [(s.prompts, True, s.input_len) for s in subsets]
    else:
        assert prompts is not None, "named prompts are read before"
        members = list(prompts.prompts)
        if options.seed is not None:
            random.Random(options.seed).shuffle(members)
        batches = [(tuple(members), prompts.speed_bench, None)]
    groups, longest = [], 0
    for batch, per_category, bucket in batches:
        order: dict[str | None, list[Prompt]] = {}
        for prompt in batch:
            order.setdefault(prompt.category if per_category else None, []).append(prompt)
        for category, members in order.items():
            chosen = members[: options.limit] if options.limit else members
            longest = max([longest, *(len(encode(p, tokenizer)) for p in chosen)])
            groups.append(PromptGroup(category, tuple(render_text(p, tokenizer) for p in chosen), bucket))
    return groups, longest


def _datasets(work: str, groups: Sequence[PromptGroup],
              options: BenchOptions) -> dict[tuple[Any, int], str | None]:
    """Each group's dataset file at each concurrency (None: random prompts, drawn by the client)."""
    return {(g.key, c): _dataset(work, g, options.requests(len(g.texts), c), options.max_new_tokens)
            if g.texts else None for g in groups for c in options.concurrency}


def _dataset(work: str, group: PromptGroup, requests: int, new_tokens: int) -> str:
    """vLLM's custom dataset (JSONL with "prompt" and "output_tokens"): the group's prompts in order, repeated
    until `requests` rows, so both servers get the same requests in the same order."""
    fd, path = tempfile.mkstemp(dir=work, suffix=".jsonl")
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        for i in range(requests):
            fh.write(json.dumps({"prompt": group.texts[i % len(group.texts)], "output_tokens": new_tokens}) + "\n")
    return path


def _client_args(model: str, dataset: str | None, concurrency: int, options: BenchOptions, *,
                 input_len: int | None = None, tokenizer: str | None = None) -> list[str]:
    """vLLM's `bench serve` arguments: the dataset file's requests (None: vLLM's random dataset of `input_len`-token
    prompts, seeded, so every server gets the same prompts), the arrivals (rate, burstiness, seed), the SLOs, no
    warm-up (eaglekit sends it before reading the counters)."""
    if dataset is None:
        requests = options.requests(0, concurrency)
        data = ["--dataset-name", "random", "--random-input-len", str(input_len), "--random-output-len",
                str(options.max_new_tokens), "--random-range-ratio", "0"]
    else:
        requests = sum(1 for _ in open(dataset, encoding="utf-8"))
        data = ["--dataset-name", "custom", "--dataset-path", dataset, "--skip-chat-template", "--disable-shuffle",
                "--no-oversample", "--custom-output-len", str(options.max_new_tokens)]
    rate = "inf" if math.isinf(options.request_rate) else f"{options.request_rate:g}"
    args = ["--backend", "vllm", "--endpoint", "/v1/completions", "--model", model, "--tokenizer", tokenizer or model,
            *data, "--num-prompts", str(requests), "--max-concurrency", str(concurrency), "--request-rate", rate,
            "--temperature", f"{options.temperature:g}", "--seed", str(options.client_seed), "--burstiness",
            f"{options.burstiness:g}", "--num-warmups", "0", "--save-detailed",
            "--percentile-metrics", PERCENTILE_METRICS, "--metric-percentiles",
            ",".join(percentile_key(q)[1:] for q in options.chosen_percentiles), "--disable-tqdm"]
    slo = ["--goodput", *(f"{name}:{limit:g}" for name, limit in options.goodput)] if options.goodput else []
    return args + slo + (["--top-p", f"{options.top_p:g}"] if options.top_p < 1 else []) + (
        ["--ignore-eos"] if options.ignore_eos else [])
