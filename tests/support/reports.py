"""The reports push reads, as verify and bench write them for a draft: its `measured` block (hashes of the draft's
own files), a verify report and a bench report with counters that agree with their rates."""

from __future__ import annotations

import hashlib
import json
import os

TARGET = "meta-llama/Llama-3.1-8B-Instruct"
TAU_LABEL = "Mean acceptance length: pooled τ (1 + Σ accepted / Σ drafting rounds)"  # the card's τ row, as it reads
VERIFY_REPORT = {
    "lossless": True, "acceptance_length": 2.81, "per_position_acceptance": [0.8, 0.6, 0.41],
    "num_speculative_tokens": 3, "tokens_per_s_spec": 120.5, "tokens_per_s_target": 60.0,
    "prompts": {"name": "mt-bench", "count": 80}, "dtype": "bfloat16", "device": "NVIDIA H200",
}


def measured(draft: str, *, name_or_path: str | None = None) -> dict:
    """The `measured` block verify writes for `draft`, from hashlib over the draft's own files."""
    index = os.path.join(draft, "model.safetensors.index.json")
    shards = set(json.load(open(index))["weight_map"].values()) if os.path.exists(index) else {"model.safetensors"}
    names = sorted(shards | {"config.json"} | ({"model.safetensors.index.json"} if os.path.exists(index) else set()))
    files = {n: "sha256:" + hashlib.sha256(open(os.path.join(draft, n), "rb").read()).hexdigest() for n in names}
    return {"draft_files": files, "target": {"name_or_path": name_or_path, "folder": "target",
                                             "config_sha256": "sha256:" + "1" * 64}}


def write_report(path, draft: str, **fields) -> str:
    path.write_text(json.dumps({**VERIFY_REPORT, "measured": measured(draft), **fields}))
    return str(path)


def bench_row(concurrency: int, base: float, spec: float, drafts: int = 40, accepted: int = 50) -> dict:
    """One bench row as `eaglekit bench` writes it; τ and per-position rates consistent with the counters."""
    positions = [accepted - accepted // 2 - accepted // 4, accepted // 2, accepted // 4]
    def side(rate: float) -> dict:
        spread = {"mean": rate, "p50": rate, "p99": rate}
        return {"completed": 12, "duration_s": 1.0, "output_tokens": 100, "output_throughput": rate * concurrency,
                "per_user_tokens_per_s": spread, "tpot_ms": spread, "ttft_ms": spread}

    return {"concurrency": concurrency, "category": None, "speed_up": spec / base,
            "speed_up_interval": {"low": spec / base - 0.1, "high": spec / base + 0.1, "level": 0.95,
                                  "method": "paired bootstrap over requests"},
            "throughput_speed_up": spec / base, "acceptance_length": 1 + accepted / drafts,
            "per_position_acceptance": sorted((p / drafts for p in positions), reverse=True),
            "num_drafts": drafts, "num_draft_tokens": 3 * drafts, "num_accepted_tokens": accepted,
            "identical_outputs": 12, "requests": 12, "samples": 12, "too_few_samples": False, "baseline": side(base),
            "speculative": side(spec)}


def write_bench(path, draft: str, **fields) -> str:
    doc = {"schema_version": "1", "num_speculative_tokens": 3, "dtype": "bfloat16", "max_new_tokens": 256,
           "engine": {"name": "vllm", "version": "0.33.0", "device_type": "cuda", "device_name": "1 x NVIDIA H200",
                      "tensor_parallel_size": 1},
           "prompts": {"name": "speed-bench-coding", "count": 80},
           "rows": [bench_row(1, 50.0, 100.0), bench_row(4, 40.0, 60.0), bench_row(16, 30.0, 27.0)],
           "verdicts": [{"category": None, "pays_at": [1, 4], "stops_paying_at": 16,
                         "text": "speculation pays up to C=4 and stops paying at C=16"}],
           "measured": measured(draft, name_or_path=TARGET), **fields}
    path.write_text(json.dumps(doc))
    return str(path)
