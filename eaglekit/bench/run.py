"""`eaglekit bench`: a drafter's serving speed-up in the engine that serves it, at each concurrency asked for.

vLLM's OpenAI-compatible server runs twice on the same target, settings and requests: the target alone, then with
the draft under the speculative config the model card prints. vLLM's own benchmark client drives each at every
concurrency (a warm-up first, outside the measurement); acceptance comes from the server's spec-decode counters.
The draft is read and checked against the target first, so a draft that cannot load costs seconds, not two server
starts. Targets too big for one device use vLLM's tensor parallelism (--tensor-parallel-size).
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from eaglekit.bench.report import BenchReport, BenchRow, ServedRun
from eaglekit.decode.prompts import Prompt, encode, render_text
from eaglekit.decode.sampling import Sampling
from eaglekit.engines.vllm import speculative_config
from eaglekit.errors import UsageError
from eaglekit.io.outputs import Role
from eaglekit.provenance import measured_files
from eaglekit.redact import public_flags
from eaglekit.runtime.engine import EngineOptions, check_engine_available, fitted_model_len
from eaglekit.runtime.server import check_client_available, engine_flags, run_client, start_server

DEFAULT_CONCURRENCY = (1, 4, 16)
MAX_REQUESTS = 100_000  # per concurrency: each is a dataset row written before the client starts
MAX_CONCURRENCY = 4096  # vLLM's max_num_seqs is the highest one
PERCENTILES = "50,99"


@dataclass(frozen=True)
class BenchOptions:
    concurrency: tuple[int, ...] = DEFAULT_CONCURRENCY
    num_speculative_tokens: int = 3
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

    @property
    def sampling(self) -> Sampling:
        return Sampling(self.temperature, self.top_p)

    def check(self) -> None:
        self.engine_options.check()
        self.sampling.check()
        if not self.concurrency or any(c < 1 for c in self.concurrency):
            raise UsageError("--concurrency takes positive integers, e.g. 1,4,16")
        if len(set(self.concurrency)) != len(self.concurrency):
            raise UsageError("--concurrency lists a value twice")
        if max(self.concurrency) > MAX_CONCURRENCY:
            raise UsageError(f"--concurrency {max(self.concurrency)}: at most {MAX_CONCURRENCY}")
        for name, value in (("--num-prompts", self.num_prompts), ("--warmups", self.warmups)):
            if value is not None and value > MAX_REQUESTS:
                raise UsageError(f"{name} {value:,}: at most {MAX_REQUESTS:,} per concurrency")
        for name, value in (("-k", self.num_speculative_tokens), ("--max-new-tokens", self.max_new_tokens),
                            ("--limit", self.limit), ("--num-prompts", self.num_prompts)):
            if value is not None and value < 1:
                raise UsageError(f"{name} must be at least 1")
        if self.warmups is not None and self.warmups < 0:
            raise UsageError("--warmups cannot be negative")
        if self.dtype not in ("bfloat16", "float16", "float32"):
            raise UsageError(f"--dtype {self.dtype!r}: use bfloat16, float16 or float32")

        given = self.engine_options.engine_args.get("max_model_len")
        if given is not None and (type(given) is not int or given < 1):
            raise UsageError(f"--engine-arg max_model_len={given!r}: expected a positive integer")

    def requests(self, prompts: int, concurrency: int) -> int:
        return self.num_prompts or max(prompts, 2 * concurrency)


@dataclass(frozen=True)
class PromptGroup:
    """Prompts measured together: a SPEED-Bench category, or the whole set (category None)."""

    category: str | None
    texts: tuple[str, ...]


def run_bench(draft: str, target: str, options: BenchOptions,
              on_stage: Callable[[str], None] | None = None) -> BenchReport:
    """Measure `draft` against `target` in vLLM at every concurrency of `options`; see the module docstring."""
    from eaglekit.decode.options import VerifyOptions
    from eaglekit.decode.setup import decode_setup

    options.check()
    say = on_stage or (lambda _: None)
    engine = options.engine_options
    check_engine_available(engine)
    check_client_available(engine.interpreter)
    verify_options = VerifyOptions(num_speculative_tokens=options.num_speculative_tokens,
                                   max_new_tokens=options.max_new_tokens, prompts_file=options.prompts_file,
                                   categories=options.categories, dtype=options.dtype, engine="vllm",
                                   engine_options=engine, outputs=options.outputs)
    setup = decode_setup([("draft", draft)], target, verify_options, load_model=False)
    (checked,) = setup.drafts
    groups, longest = _groups(setup.prompts.prompts, setup.tokenizer, options.limit, setup.prompts.speed_bench)
    k = options.num_speculative_tokens
    model_len = engine.engine_args.get("max_model_len") or fitted_model_len(longest, options.max_new_tokens, k,
                                                                            setup.info.max_position_embeddings)
    if longest + options.max_new_tokens + k > model_len:
        raise UsageError(f"the longest prompt's {longest:,} tokens, {options.max_new_tokens:,} new ones and {k} drafts "
                         f"exceed max_model_len {model_len:,}")
    max_seqs = max(options.concurrency)
    target_path = os.path.abspath(target)
    base_settings = {"tokenizer": target_path, "dtype": options.dtype, "max_model_len": model_len,
                     "max_num_seqs": max_seqs, "seed": 0, "tensor_parallel_size": engine.tensor_parallel_size,
                     **engine.engine_args}
    spec_config = speculative_config(os.path.abspath(checked.path), k)
    report = BenchReport(
        checked.path, target, checked.spec.eagle_version, k, options.max_new_tokens, options.dtype,
        {"name": setup.prompts.name, "count": sum(len(g.texts) for g in groups),
         "speed_bench": setup.prompts.speed_bench,
         "categories": [g.category for g in groups if g.category is not None], "ignore_eos": options.ignore_eos},
        {}, spec_config, measured_files(checked.spec, setup.info), sampling=options.sampling)
    started = time.perf_counter()
    runs: dict[str, dict[tuple[str | None, int], ServedRun]] = {}
    with tempfile.TemporaryDirectory(prefix="eaglekit-bench-") as work:
        files = {(g.category, c): _dataset(work, g, options.requests(len(g.texts), c), options.max_new_tokens)
                 for g in groups for c in options.concurrency}
        for side, settings in (("target alone", base_settings),
                               ("target + draft", {**base_settings, "speculative_config": spec_config})):
            say(f"{side}: starting vLLM")
            server = start_server(engine.interpreter, work, side,
                                  argv=["--model", target_path, *engine_flags(settings)], target=target_path,
                                  dtype=options.dtype, positions=model_len * max_seqs,
                                  given=list(engine.engine_args), timeout_s=options.start_timeout_s)
            try:
                measured = {}
                for group in groups:
                    for c in options.concurrency:
                        label = f"C={c}" + (f", {group.category}" if group.category else "")
                        say(f"{side}: {label}")
                        args = _client_args(target_path, files[(group.category, c)], c, options)
                        measured[(group.category, c)] = ServedRun.from_vllm(
                            run_client(engine.interpreter, work, server, args, what=label, timeout_s=engine.timeout_s))
            finally:
                server.stop()
            runs[side] = measured
            key = "baseline" if side == "target alone" else "speculative"
            report.timings[f"{key}_start_s"] = server.start_s
            report.engine.setdefault("server_args", {})[key] = public_flags(server.flags)
            report.engine.update(name="vllm", version=server.info.get("vllm_version"),
                                 device_type=server.info.get("device_type"),
                                 device_name=server.info.get("device_name"),
                                 tensor_parallel_size=engine.tensor_parallel_size, max_model_len=model_len,
                                 max_num_seqs=max_seqs, memory_sizing=server.info.get("sized") or None,
                                 cpu_kv_cache_gib=server.info.get("kv_cache_gib_cpu"),
                                 client="vllm bench serve", endpoint="/v1/completions")
    report.timings["total_s"] = time.perf_counter() - started
    alone, drafted = runs["target alone"], runs["target + draft"]
    report.rows = [BenchRow(c, g.category, alone[(g.category, c)], drafted[(g.category, c)])
                   for g in groups for c in options.concurrency]
    return report


def _groups(prompts: Sequence[Prompt], tokenizer, limit: int | None,
            per_category: bool) -> tuple[list[PromptGroup], int]:
    """The prompts as the server receives them, grouped (by category for SPEED-Bench), the first `limit` of each;
    and the longest one in target tokens (checked against the target's context as verify checks it)."""
    order: dict[str | None, list[Prompt]] = {}
    for prompt in prompts:
        order.setdefault(prompt.category if per_category else None, []).append(prompt)
    groups, longest = [], 0
    for category, members in order.items():
        chosen = members[:limit] if limit else members
        longest = max([longest, *(len(encode(p, tokenizer)) for p in chosen)])
        groups.append(PromptGroup(category, tuple(render_text(p, tokenizer) for p in chosen)))
    return groups, longest


def _dataset(work: str, group: PromptGroup, requests: int, new_tokens: int) -> str:
    """vLLM's custom dataset (JSONL with "prompt" and "output_tokens"): the group's prompts in order, repeated
    until `requests` rows, so both servers get the same requests in the same order."""
    fd, path = tempfile.mkstemp(dir=work, suffix=".jsonl")
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        for i in range(requests):
            fh.write(json.dumps({"prompt": group.texts[i % len(group.texts)], "output_tokens": new_tokens}) + "\n")
    return path


def _client_args(model: str, dataset: str, concurrency: int, options: BenchOptions) -> list[str]:
    requests = sum(1 for _ in open(dataset, encoding="utf-8"))
    warmups = concurrency if options.warmups is None else options.warmups
    args = ["--backend", "vllm", "--endpoint", "/v1/completions", "--model", model, "--tokenizer", model,
            "--dataset-name", "custom", "--dataset-path", dataset, "--skip-chat-template", "--disable-shuffle",
            "--no-oversample", "--custom-output-len", str(options.max_new_tokens), "--num-prompts", str(requests),
            "--max-concurrency", str(concurrency), "--request-rate", "inf", "--temperature",
            f"{options.temperature:g}", "--seed", "0", "--num-warmups", str(warmups), "--save-detailed",
            "--percentile-metrics", "ttft,tpot,itl,e2el", "--metric-percentiles", PERCENTILES, "--disable-tqdm"]
    return args + (["--top-p", f"{options.top_p:g}"] if options.top_p < 1 else []) + (
        ["--ignore-eos"] if options.ignore_eos else [])
