"""What eaglekit runs inside the Python that has vLLM installed: one offline run, a server, or vLLM's benchmark client.

    python vllm_worker.py REQUEST.json RESULT.json        # verify --engine: one offline run
    python vllm_worker.py serve REQUEST.json INFO.json    # bench: vLLM's OpenAI-compatible server, sized for the job
    python vllm_worker.py bench-client FOLDER             # bench: vLLM's own `bench serve` client, answering requests

It imports only vLLM and the standard library (vLLM pins its own torch and transformers, so it often lives in
an environment of its own). The offline request names the target, the draft (absent: target alone), token ids of
every prompt, k, max_new_tokens, dtype and extra LLM(...) arguments; the result holds every prompt's greedy
tokens and vLLM's own spec-decode counters from LLM.get_metrics(). vLLM's log goes to stderr, where the parent
reads which aux layers the engine captured.
"""

from __future__ import annotations

import json
import math
import os
import runpy
import sys
import time

if sys.path and os.path.abspath(sys.path[0] or ".") == os.path.dirname(os.path.abspath(__file__)):
    del sys.path[0]  # this folder holds eaglekit modules whose names could shadow the standard library's

COUNTERS = {
    "vllm:spec_decode_num_drafts": "drafts",
    "vllm:spec_decode_num_draft_tokens": "draft_tokens",
    "vllm:spec_decode_num_accepted_tokens": "accepted",
}
PER_POSITION = "vllm:spec_decode_num_accepted_tokens_per_pos"
PER_REQUEST = "per_request_spec_decode_metrics"  # an LLM(...) argument from vLLM 0.29
CPU_KV_CACHE = "VLLM_CPU_KVCACHE_SPACE"  # GiB of KV cache vLLM's CPU worker reserves (unset: 92 % of a NUMA node)
FALLBACK_KV_CACHE_GIB = 4  # when the target's config does not say its attention geometry
GPU_SHARE = 0.9  # vLLM's own default gpu_memory_utilization: the most of a device it takes when it is free
FREE_MARGIN = 0.95  # of the memory free at start: vLLM refuses to start when its share exceeds what is free
IN_PROCESS_ENGINE = "VLLM_ENABLE_V1_MULTIPROCESSING"  # "0": the offline engine core runs in the caller's process


def one_process_executor(tensor_parallel_size: int, given: set[str]) -> dict:
    """On one device the model runs in the engine's own process ("uni"): vLLM's CPU platform otherwise spawns a
    worker process that re-imports vLLM and torch (about 10 s a start on a small CPU) for the same forward passes
    and the same counters. Tensor parallel keeps vLLM's multiprocess executor; a caller's choice is kept."""
    if tensor_parallel_size != 1 or "distributed_executor_backend" in given:
        return {}
    return {"distributed_executor_backend": "uni"}


def _metrics(llm) -> dict:
    out: dict = {}
    for metric in llm.get_metrics():
        if metric.name in COUNTERS:
            out[COUNTERS[metric.name]] = out.get(COUNTERS[metric.name], 0) + int(metric.value)
        elif metric.name == PER_POSITION:
            values = [int(v) for v in metric.values]
            previous = out.get("accepted_per_position", [0] * len(values))
            out["accepted_per_position"] = [a + b for a, b in zip(previous, values)]
    return out


def _histogram(output) -> list[int] | None:
    """Rounds per accepted-draft count of one request (None: this vLLM has no per-request metrics)."""
    metrics = getattr(output.outputs[0], "spec_decode_metrics", None)
    return list(metrics.to_dict()["acceptance_histogram"]) if metrics is not None else None


def kv_cache_bytes(target: str, dtype: str, positions: int) -> int | None:
    """The KV cache the job needs: keys and values of every target layer for `positions` tokens, doubled for the
    draft's layer and vLLM's block rounding (None: the target's config does not say its attention geometry)."""
    try:
        with open(os.path.join(target, "config.json"), encoding="utf-8") as fh:
            cfg = json.load(fh)
        text = cfg["text_config"] if isinstance(cfg.get("text_config"), dict) else cfg
        heads = int(text["num_attention_heads"])
        kv_heads = int(text.get("num_key_value_heads") or heads)
        head_dim = int(text.get("head_dim") or int(text["hidden_size"]) // heads)
        layers = int(text["num_hidden_layers"])
    except (OSError, ValueError, KeyError, TypeError, ZeroDivisionError):
        return None
    itemsize = 4 if "32" in dtype else 2
    return 2 * 2 * layers * kv_heads * head_dim * itemsize * positions


def cpu_kv_cache_gib(target: str, dtype: str, positions: int) -> int:
    """The KV cache the job needs on a CPU, in whole GiB, at least 1. vLLM's CPU worker otherwise reserves 92 % of
    a NUMA node's memory and refuses to start beside any other process."""
    needed = kv_cache_bytes(target, dtype, positions)
    return FALLBACK_KV_CACHE_GIB if needed is None else max(1, math.ceil(needed / 2**30))


def size_for_job(target: str, dtype: str, positions: int, given: set[str]) -> dict:
    """Memory settings that let vLLM start beside other processes, for engine settings the caller did not give
    (`given`: their names). CPU: the KV cache the job needs (VLLM_CPU_KVCACHE_SPACE, set in this process's
    environment). CUDA: vLLM refuses to start when gpu_memory_utilization x total exceeds the free memory, so its
    share is capped by what is free, and the KV cache is the job's (kv_cache_memory_bytes) rather than all the rest."""
    from vllm.platforms import current_platform

    if current_platform.is_cpu():
        if not os.environ.get(CPU_KV_CACHE):
            os.environ[CPU_KV_CACHE] = str(cpu_kv_cache_gib(target, dtype, positions))
        return {}
    if not current_platform.is_cuda_alike():
        return {}
    import torch

    settings: dict = {}
    if "gpu_memory_utilization" not in given:
        free, total = torch.cuda.mem_get_info()
        settings["gpu_memory_utilization"] = round(min(GPU_SHARE, FREE_MARGIN * free / total), 3)
    needed = kv_cache_bytes(target, dtype, positions)
    if needed is not None and not given & {"kv_cache_memory_bytes", "gpu_memory_utilization"}:
        settings["kv_cache_memory_bytes"] = needed
    return settings


def platform_info() -> dict:
    """The device vLLM runs on, as a report names it."""
    from vllm.platforms import current_platform

    device = current_platform.device_type
    name = None
    if current_platform.is_cuda_alike():
        import torch

        name = f"{torch.cuda.device_count()} x {torch.cuda.get_device_name(0)}"
    else:
        import platform

        name = platform.processor() or platform.machine()
        try:
            with open("/proc/cpuinfo", encoding="utf-8") as fh:
                model = next((ln.split(":", 1)[1].strip() for ln in fh if ln.startswith("model name")), None)
            name = model or name
        except OSError:
            pass
        name = f"{name}, {os.cpu_count()} cores"
    return {"device_type": device, "device_name": name}


def main(request_path: str, result_path: str) -> None:
    with open(request_path, encoding="utf-8") as fh:
        request = json.load(fh)
    os.environ.setdefault(IN_PROCESS_ENGINE, "0")  # one offline run: no engine-core process to start and feed
    import vllm
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    kwargs = dict(model=request["target"], tokenizer=request["target"], dtype=request["dtype"], seed=0,
                  disable_log_stats=False, tensor_parallel_size=request["tensor_parallel_size"])
    kwargs.update(request["engine_args"])
    kwargs.update(one_process_executor(int(request["tensor_parallel_size"]), set(request["engine_args"])))
    if request.get("draft"):
        kwargs["speculative_config"] = {"method": "eagle3", "model": request["draft"],
                                        "num_speculative_tokens": request["k"], **request.get("speculative", {})}
        from dataclasses import fields

        from vllm.engine.arg_utils import EngineArgs

        if PER_REQUEST in {f.name for f in fields(EngineArgs)}:
            kwargs.setdefault(PER_REQUEST, "summary")
    positions = int(kwargs.get("max_model_len") or 2048) * int(kwargs.get("max_num_seqs") or 1)
    kwargs.update(size_for_job(request["target"], request["dtype"], positions, set(request["engine_args"])))
    started = time.perf_counter()
    llm = LLM(**kwargs)
    ready = time.perf_counter()
    params = SamplingParams(temperature=0.0, max_tokens=request["max_new_tokens"])
    outputs = llm.generate([TokensPrompt(prompt_token_ids=ids) for ids in request["prompts"]], params, use_tqdm=False)
    done = time.perf_counter()
    result = {
        "vllm_version": vllm.__version__,
        "tokens": [list(o.outputs[0].token_ids) for o in outputs],
        "metrics": _metrics(llm) if request.get("draft") else {},
        "per_request": [_histogram(o) for o in outputs] if request.get("draft") else None,
        "init_s": ready - started,
        "generate_s": done - ready,
    }
    with open(result_path, "w", encoding="utf-8") as fh:
        json.dump(result, fh)


def serve(request_path: str, info_path: str) -> None:
    """vLLM's OpenAI-compatible server (its own module, run as `python -m` would), sized for the job; what it runs
    on is written to INFO first. The request holds the server's command-line arguments, the target, dtype, the KV
    positions the job needs and the engine settings the caller gave."""
    with open(request_path, encoding="utf-8") as fh:
        request = json.load(fh)
    import vllm

    argv = list(request["argv"])
    sized = size_for_job(request["target"], request["dtype"], request["positions"], set(request["given"]))
    for name, value in sized.items():
        argv += [f"--{name.replace('_', '-')}", str(value)]
    from vllm.platforms import current_platform

    if current_platform.is_cpu() and "enforce_eager" not in request["given"]:
        argv.append("--enforce-eager")  # graph capture and compilation cost minutes on a CPU and serve no faster
    parallel = int(argv[argv.index("--tensor-parallel-size") + 1]) if "--tensor-parallel-size" in argv else 1
    for name, value in one_process_executor(parallel, set(request["given"])).items():
        argv += [f"--{name.replace('_', '-')}", value]
    info = {"vllm_version": vllm.__version__, **platform_info(), "sized": sized,
            "kv_cache_gib_cpu": os.environ.get(CPU_KV_CACHE) if current_platform.is_cpu() else None,
            "argv": argv}
    with open(info_path, "w", encoding="utf-8") as fh:
        json.dump(info, fh)
    sys.argv = ["vllm.entrypoints.openai.api_server", *argv]
    runpy.run_module("vllm.entrypoints.openai.api_server", run_name="__main__", alter_sys=True)


def bench_client(folder: str) -> None:
    """vLLM's own benchmark client (`vllm bench serve`; its console script fails in the CPU wheel), kept running for
    a whole bench: it says "ready" once vLLM and pandas import, then answers request N (its argument list) with
    N.result.json (the result dict) or N.error (the traceback), until it is stopped."""
    import importlib
    import traceback

    try:
        parsers = importlib.import_module("vllm.utils.argparse_utils")
    except ImportError:  # vLLM before the argparse helpers had a module of their own
        parsers = importlib.import_module("vllm.utils")
    importlib.import_module("pandas")  # vLLM's client reads its datasets with it; missing, it fails later, misleadingly
    from vllm.benchmarks.serve import add_cli_args
    from vllm.benchmarks.serve import main as bench_main

    _publish(os.path.join(folder, "ready"), "")
    number = 0
    while True:
        request = os.path.join(folder, f"{number}.request.json")
        if not os.path.exists(request):
            time.sleep(0.05)
            continue
        with open(request, encoding="utf-8") as fh:
            args = json.load(fh)["args"]
        parser = parsers.FlexibleArgumentParser()
        add_cli_args(parser)
        try:
            result = bench_main(parser.parse_args(args))
        except (Exception, SystemExit):
            traceback.print_exc()
            _publish(os.path.join(folder, f"{number}.error"), traceback.format_exc())
        else:
            _publish(os.path.join(folder, f"{number}.result.json"), json.dumps(result, default=str))
        number += 1


def _publish(path: str, text: str) -> None:
    """Write `path` whole or not at all: the reader polls for its name."""
    with open(f"{path}.part", "w", encoding="utf-8") as fh:
        fh.write(text)
    os.replace(f"{path}.part", path)


if __name__ == "__main__":
    if sys.argv[1] == "serve":
        serve(sys.argv[2], sys.argv[3])
    elif sys.argv[1] == "bench-client":
        bench_client(sys.argv[2])
    else:
        main(sys.argv[1], sys.argv[2])
