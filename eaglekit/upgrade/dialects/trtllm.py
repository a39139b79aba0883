"""TensorRT-LLM: vLLM's flat layout (which its PyTorch backend reads: fc_norm and norm_output top level,
norm_before_fc inside eagle_config, draft_vocab_size beside vocab_size), with norm_output also written as
eagle_config.return_hidden_post_norm, and checked against TensorRT-LLM's rules. The capture layers are never
read from the files: the report gives the `eagle3_layers_to_capture` setting that pins them.
"""

from __future__ import annotations

from typing import Any

from eaglekit.spec import DraftSpec
from eaglekit.upgrade.decide import Decisions
from eaglekit.upgrade.dialects import vllm
from eaglekit.upgrade.vocab import VocabPlan

NAME = "trtllm"
ENGINE = "trtllm"


def read_family(spec: DraftSpec, d: Decisions) -> str:
    return "vllm"


def config(spec: DraftSpec, d: Decisions, vocab: VocabPlan) -> dict[str, Any]:
    cfg = vllm.config(spec, d, vocab)
    if d.norm_output:
        cfg["eagle_config"]["return_hidden_post_norm"] = True
    return cfg


def tensor_name(canonical: str, spec: DraftSpec) -> str:
    return canonical
