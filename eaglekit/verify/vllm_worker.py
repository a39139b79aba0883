"""One vLLM offline run for `eaglekit verify --engine vllm`, executed by the Python that has vLLM installed.

    python vllm_worker.py REQUEST.json RESULT.json

It imports only vLLM and the standard library (vLLM pins its own torch and transformers, so it often lives in
an environment of its own). The request names the target, the draft (absent: target alone), token ids of
every prompt, k, max_new_tokens, dtype and extra LLM(...) arguments; the result holds every prompt's greedy
tokens and vLLM's own spec-decode counters from LLM.get_metrics(). vLLM's log goes to stderr, where the parent
reads which aux layers the engine captured.
"""

from __future__ import annotations

import json
import math
import os
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


def cpu_kv_cache_gib(target: str, dtype: str, positions: int) -> int:
    """The KV cache the job needs on a CPU, in whole GiB: keys and values of every target layer for `positions`
    tokens, doubled for the draft's layer and vLLM's block rounding, at least 1. vLLM's CPU worker otherwise
    reserves 92 % of a NUMA node's memory and refuses to start beside any other process."""
    try:
        with open(os.path.join(target, "config.json"), encoding="utf-8") as fh:
            cfg = json.load(fh)
        text = cfg["text_config"] if isinstance(cfg.get("text_config"), dict) else cfg
        heads = int(text["num_attention_heads"])
        kv_heads = int(text.get("num_key_value_heads") or heads)
        head_dim = int(text.get("head_dim") or int(text["hidden_size"]) // heads)
        layers = int(text["num_hidden_layers"])
    except (OSError, ValueError, KeyError, TypeError, ZeroDivisionError):
        return FALLBACK_KV_CACHE_GIB
    itemsize = 4 if "32" in dtype else 2
    needed = 2 * 2 * layers * kv_heads * head_dim * itemsize * positions
    return max(1, math.ceil(needed / 2**30))


def main(request_path: str, result_path: str) -> None:
    with open(request_path, encoding="utf-8") as fh:
        request = json.load(fh)
    import vllm
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    kwargs = dict(model=request["target"], tokenizer=request["target"], dtype=request["dtype"], seed=0,
                  disable_log_stats=False, tensor_parallel_size=request["tensor_parallel_size"])
    kwargs.update(request["engine_args"])
    if request.get("draft"):
        kwargs["speculative_config"] = {"method": "eagle3", "model": request["draft"],
                                        "num_speculative_tokens": request["k"]}
        from dataclasses import fields

        from vllm.engine.arg_utils import EngineArgs

        if PER_REQUEST in {f.name for f in fields(EngineArgs)}:
            kwargs.setdefault(PER_REQUEST, "summary")
    from vllm.platforms import current_platform

    if current_platform.is_cpu() and not os.environ.get(CPU_KV_CACHE):
        positions = int(kwargs.get("max_model_len") or 2048) * int(kwargs.get("max_num_seqs") or 1)
        os.environ[CPU_KV_CACHE] = str(cpu_kv_cache_gib(request["target"], request["dtype"], positions))
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


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
