"""TensorRT-LLM: vLLM's flat layout (which its PyTorch backend reads: fc_norm and norm_output top level,
norm_before_fc inside eagle_config, draft_vocab_size beside vocab_size), with norm_output also written as
eagle_config.return_hidden_post_norm, and checked against TensorRT-LLM's rules. The capture layers are never
read from the files: the report gives the `eagle3_layers_to_capture` setting that pins them.
"""

from __future__ import annotations

from typing import Any

from eaglekit.catalogue import output_name
from eaglekit.spec import DraftSpec
from eaglekit.target import TargetInfo
from eaglekit.upgrade import folder
from eaglekit.upgrade.decide import Decisions
from eaglekit.upgrade.dialects import NO_PARALLEL_DRAFTING, NO_QWEN3_CLASS, vllm
from eaglekit.upgrade.vocab import VocabPlan

NAME = "trtllm"
ENGINE = "trtllm"
FINETUNE_READS = False
ONE_FILE = False  # a folder whose weights --max-shard-size splits into shards
CANNOT_WRITE: dict[str, str] = {"qwen3": NO_QWEN3_CLASS, "parallel_drafting": NO_PARALLEL_DRAFTING}
CAVEATS: dict[str, str] = {}
WRITER = folder


def read_family(spec: DraftSpec, d: Decisions) -> str:
    return "vllm"


def config(spec: DraftSpec, d: Decisions, vocab: VocabPlan) -> dict[str, Any]:
    cfg = vllm.config(spec, d, vocab)
    if d.norm_output:
        cfg["eagle_config"]["return_hidden_post_norm"] = True
    return cfg


def tensor_name(canonical: str, spec: DraftSpec) -> str | None:
    return output_name(canonical, NAME, spec)


def refusal(spec: DraftSpec, d: Decisions, target: TargetInfo | None) -> str | None:
    return None
