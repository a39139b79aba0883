"""Output dialects: each writes a config (and names tensors) out of the canonical description, never reads one.

A dialect module provides NAME, ENGINE (what `eaglekit validate --engine` checks it against), FINETUNE_READS
(whether `eaglekit finetune` trains drafts in this layout), ONE_FILE (the output is one file, not a folder of
weight shards), CANNOT_WRITE (feature -> why this output cannot carry
it: "mla", "qwen3", "eagle31" (trained or added fc_norm / norm_output), "norm_before_residual", "parallel_drafting"
(a P-EAGLE draft)), CAVEATS (feature -> a warning when the output carries it), `read_family(spec, decisions)` (the
family that reads its output back), `config(spec, decisions, vocab)`, `tensor_name(canonical, spec)` (from
eaglekit.catalogue; None: the output has no such tensor), `refusal(spec, decisions, target)` (what else it cannot
write of this draft) and WRITER, the module that writes it (`check_destination`, `contents`, `write`).
"""

from __future__ import annotations

import importlib
from types import ModuleType

from eaglekit.errors import UsageError

NAMES = ("vllm", "sglang", "speculators", "trtllm", "gguf")
NO_QWEN3_CLASS = "that engine has no EAGLE-3 draft class with Qwen3 q/k norms; use --to vllm or --to speculators"
NO_PARALLEL_DRAFTING = ("the source is a P-EAGLE draft (parallel drafting: its later slots were trained on a mask "
                        "token and mask_hidden, not on fed-back states), which eaglekit models in vLLM only: write "
                        "--to vllm")


def get_dialect(name: str) -> ModuleType:
    if name not in NAMES:
        raise UsageError(f"unknown output dialect {name!r}; known: {', '.join(NAMES)}")
    return importlib.import_module(f"{__name__}.{name}")


def writes_one_file(name: str) -> bool:
    """Whether the dialect writes one file (no weight shards for --max-shard-size to size)."""
    return name in NAMES and get_dialect(name).ONE_FILE


def writes_eagle31(name: str) -> bool:
    """Whether the dialect can carry EAGLE-3.1's fc_norm and norm_output (then they are on by default)."""
    return name not in NAMES or "eagle31" not in get_dialect(name).CANNOT_WRITE
