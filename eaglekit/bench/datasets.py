"""SPEED-Bench by name (`--dataset-name speed_bench`), read as vLLM's `bench serve` reads it, from this machine.

vLLM's client (vllm/benchmarks/datasets/datasets.py, SpeedBench and --speed-bench-* options, the same in 0.32.0 and
0.33.0) reads `<dataset-path>/<subset>.jsonl`, a folder prepared by NeMo-Skills' speed-bench script, whose rows hold
`messages` (the prompt is the first message's content) and `category`; its subsets are `qualitative` (11 categories
of 80 prompts) and `throughput_1k`, `_2k`, `_8k`, `_16k`, `_32k` (input lengths by name: categories `low_entropy`,
`mixed`, `high_entropy`); --speed-bench-category keeps one category; the rows are shuffled with --seed. eaglekit reads
the same folder, and also the dataset's own schema (`question_id`, `category`, `turns`: the Hub's parquet files or a
JSONL export, in a folder or the Hugging Face cache): the Hub itself is never asked. Every category is measured on
its own, so the prompts are grouped by category rather than mixed.
"""

from __future__ import annotations

import glob
import os
import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from eaglekit.decode import speedbench
from eaglekit.decode.prompts import Prompt
from eaglekit.errors import CheckpointError, UsageError
from eaglekit.io.jsonfile import parse_json, read_bounded

DATASET_NAMES = ("speed_bench",)
HUB_ID = "nvidia/SPEED-Bench"
SUBSET_INPUT_LEN = {"throughput_1k": 1024, "throughput_2k": 2048, "throughput_8k": 8192, "throughput_16k": 16384,
                    "throughput_32k": 32768}
"""The throughput subsets vLLM's --speed-bench-dataset-subset offers, and the input length each is named for."""
SUBSETS = ("qualitative", *SUBSET_INPUT_LEN)


@dataclass(frozen=True)
class SubsetPrompts:
    """One subset's prompts, in the seeded order, and the input length its name gives (None: qualitative)."""

    subset: str
    path: str
    prompts: tuple[Prompt, ...]
    input_len: int | None


def check_subsets(subsets: Sequence[str]) -> None:
    unknown = [s for s in subsets if s not in SUBSETS]
    if unknown:
        raise UsageError(f"--speed-bench-dataset-subset {unknown[0]!r}: use one of {', '.join(SUBSETS)}")
    if len(set(subsets)) != len(subsets):
        raise UsageError("--speed-bench-dataset-subset lists a subset twice")


def hub_cache_folders() -> list[str]:
    """The snapshots of nvidia/SPEED-Bench in the Hugging Face cache ($HF_HUB_CACHE, else $HF_HOME/hub), newest
    first."""
    home = os.environ.get("HF_HOME") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "huggingface")
    cache = os.environ.get("HF_HUB_CACHE") or os.path.join(home, "hub")
    snapshots = glob.glob(os.path.join(cache, "datasets--nvidia--SPEED-Bench", "snapshots", "*"))
    return sorted(snapshots, key=os.path.getmtime, reverse=True)


def subset_files(folder: str, subset: str) -> list[str]:
    """The files of `subset` in `folder`: vLLM's prepared `<subset>.jsonl`, else a parquet export or the Hub's
    layout (`<subset>/*.parquet`, `data/<subset>-*.parquet`)."""
    for pattern in (f"{subset}.jsonl", f"{subset}.parquet", os.path.join(subset, "*.parquet"),
                    os.path.join(subset, "*.jsonl"), os.path.join("data", f"{subset}-*.parquet")):
        found = sorted(glob.glob(os.path.join(glob.escape(folder), pattern)))
        if found:
            return found
    return []


def locate(dataset_path: str | None, subset: str) -> list[str]:
    """The files holding `subset`: under --dataset-path, else in the Hugging Face cache; none is one line naming
    what to pass."""
    if dataset_path is not None:
        if os.path.isfile(dataset_path):
            return [dataset_path]
        if not os.path.isdir(dataset_path):
            raise CheckpointError("no such file or folder: pass --dataset-path a folder holding SPEED-Bench's "
                                  f"{subset}.jsonl (vLLM's prepared layout) or its parquet files", dataset_path)
        found = subset_files(dataset_path, subset)
        if not found:
            raise CheckpointError(f"no SPEED-Bench subset {subset!r} here (looked for {subset}.jsonl, "
                                  f"{subset}.parquet, {subset}/*.parquet): pass --dataset-path the folder that "
                                  "holds it", dataset_path)
        return found
    for folder in hub_cache_folders():
        found = subset_files(folder, subset)
        if found:
            return found
    raise CheckpointError(f"SPEED-Bench ({HUB_ID}, subset {subset}) is not in the Hugging Face cache and the Hub is "
                          "not asked: pass --dataset-path DIR, a folder holding "
                          f"{subset}.jsonl (prepared as for vllm bench serve) or the dataset's parquet files",
                          "--dataset-name speed_bench")


def _prepared_prompt(record: Any, where: str, line: int) -> Prompt:
    """A row of vLLM's prepared layout: the first message's content is the prompt, as vLLM's SpeedBench takes it."""
    messages = record.get("messages") if isinstance(record, dict) else None
    first = messages[0] if isinstance(messages, list) and messages else None
    if not isinstance(first, dict) or not isinstance(first.get("content"), str) or not isinstance(
            record.get("category"), str):
        raise CheckpointError(f"line {line}: SPEED-Bench rows need \"messages\" (a list whose first entry has "
                              "\"content\") and \"category\", or \"question_id\", \"category\" and \"turns\"", where)
    if speedbench.SENTINEL in first["content"]:
        raise CheckpointError(f"line {line} still holds SPEED-Bench's placeholder instead of its text; rebuild it "
                              "with the dataset's preparation script, which needs network access", where)
    name = str(record.get("question_id") or record.get("id") or line)
    return Prompt(name, ({"role": "user", "content": first["content"]},), None, record["category"], name,
                  file=where, record=f"line {line}")


def read_file(path: str) -> tuple[Prompt, ...]:
    """One file of a subset, in either schema (see the module docstring); first user turns only, as vLLM's."""
    if path.endswith(".parquet"):
        rows = speedbench.select(speedbench.read_speed_bench(path), (), path)
        return _first_turns(rows, path)
    try:
        text = read_bounded(path, "SPEED-Bench file", speedbench.MAX_BYTES).decode("utf-8")
    except UnicodeDecodeError:
        raise CheckpointError("SPEED-Bench file is not UTF-8 text", path) from None
    records = [(i + 1, parse_json(line, path, f"line {i + 1}")) for i, line in enumerate(text.splitlines())
               if line.strip()]
    if not records:
        raise CheckpointError("no rows in the SPEED-Bench file", path)
    if speedbench.looks_like_speed_bench(path, records[0][1]):
        rows = speedbench.select(speedbench.read_speed_bench(path, [r for _, r in records]), (), path)
        return _first_turns(rows, path)
    return tuple(_prepared_prompt(record, path, line) for line, record in records)


def _first_turns(rows: Sequence[speedbench.SpeedBenchRow], path: str) -> tuple[Prompt, ...]:
    return tuple(Prompt(r.question_id, ({"role": "user", "content": r.turns[0]},), None, r.category, r.question_id,
                        file=path, record=f"question_id {r.question_id!r}"[:120]) for r in rows)


def read_subset(dataset_path: str | None, subset: str, categories: Sequence[str], seed: int) -> SubsetPrompts:
    """The subset's prompts of `categories` (all when none), shuffled with `seed` as vLLM's client shuffles them."""
    files = locate(dataset_path, subset)
    prompts = [p for path in files for p in read_file(path)]
    if categories:
        known = sorted({p.category for p in prompts if p.category})
        unknown = [c for c in categories if c not in known]
        if unknown:
            raise UsageError(f"--category {', '.join(unknown)}: not in SPEED-Bench {subset} at {files[0]} (it has "
                             f"{', '.join(known)})")
        prompts = [p for p in prompts if p.category in categories]
    random.Random(seed).shuffle(prompts)
    return SubsetPrompts(subset, files[0], tuple(prompts), SUBSET_INPUT_LEN.get(subset))
