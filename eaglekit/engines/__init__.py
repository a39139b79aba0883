"""The serving engines eaglekit models: one record each (eaglekit/engines/<engine>.py), listed once here.

vLLM is modelled over a range of releases (0.21.0 .. 0.33.0, reference §4 and §11); SGLang, TensorRT-LLM,
llama.cpp and tokenspeed at one release each, read from their code. To add an engine: write its module (facts,
version floors, settings, serve command, `RECORD`) and its rules module, then list its record in `RECORDS`.
"""

from __future__ import annotations

from eaglekit.engines import llamacpp, sglang, tokenspeed, trtllm, vllm
from eaglekit.engines.base import (
    Engine,
    IdReading,
    Version,
    format_version,
    output_of_layer,
    parse_version,
)
from eaglekit.engines.sglang import DEEPSEEK_TARGET_TYPES, SglangView, sglang_capture, sglang_view
from eaglekit.engines.vllm import (
    CLASS_ATTENTION,
    VLLM_ACCEPTS,
    VLLM_D2T_OPTIONAL,
    VLLM_OLDEST_KNOWN,
    VLLM_RUNNERS,
    VllmView,
    vllm_default_runner,
    vllm_runner_ids,
    vllm_view,
)

RECORDS: dict[str, Engine] = {r.name: r for r in (vllm.RECORD, sglang.RECORD, trtllm.RECORD, llamacpp.RECORD,
                                                  tokenspeed.RECORD)}
VLLM, SGLANG, TRTLLM, LLAMACPP, TOKENSPEED = (vllm.VLLM, sglang.SGLANG, trtllm.TRTLLM, llamacpp.LLAMACPP,
                                               tokenspeed.TOKENSPEED)

__all__ = [
    "CLASS_ATTENTION", "DEEPSEEK_TARGET_TYPES", "LLAMACPP",
    "RECORDS", "SGLANG", "TOKENSPEED", "TRTLLM", "VLLM", "VLLM_ACCEPTS", "VLLM_D2T_OPTIONAL", "VLLM_OLDEST_KNOWN",
    "VLLM_RUNNERS", "Engine", "IdReading", "SglangView", "Version", "VllmView", "engine_record", "format_version",
    "output_of_layer", "parse_version", "sglang_capture", "sglang_view",
    "vllm_default_runner", "vllm_runner_ids", "vllm_view",
]


def engine_record(name: str) -> Engine:
    """The record of a known engine (names come from RECORDS, so a miss is a programming error)."""
    return RECORDS[name]
