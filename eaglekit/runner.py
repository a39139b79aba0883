"""Who runs the target: eaglekit's reference (transformers, in this process) or vLLM (the serving engine, out of
process). One name for the choice everywhere it is offered (capture --engine, compare --engine, verify --engine,
finetune --eval-engine), so the options and the library cannot disagree on its spelling."""

from __future__ import annotations

from typing import Literal, get_args

Runner = Literal["reference", "vllm"]
RUNNERS: tuple[Runner, ...] = get_args(Runner)
REFERENCE, ENGINE_ALONE = RUNNERS
