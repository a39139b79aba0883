"""Prompt sets for verify: the bundled coding prompts, a user's JSONL file, and a long-context mode.

Long context prepends real Python source (from standard-library modules, read with `inspect.getsource`
at run time) cut to an exact number of target tokens, so acceptance can be compared at short and long
context with everything else equal.
"""

from __future__ import annotations

import importlib
import inspect
import os
from collections.abc import Sequence
from dataclasses import dataclass
from importlib import resources
from typing import Any

from eaglekit.errors import CheckpointError, UsageError
from eaglekit.io.jsonfile import parse_json, read_bounded

BUNDLED_NAME = "eaglekit-coding"
CONTEXT_MODULES = (
    "textwrap", "json.decoder", "argparse", "dataclasses", "functools", "heapq", "difflib", "shlex",
    "fractions", "statistics", "calendar", "ipaddress", "pprint", "string", "bisect", "csv",
)
CONTEXT_TEMPLATE = "Here is some Python source code for reference:\n\n```python\n{context}\n```\n\n{prompt}"


@dataclass(frozen=True)
class Prompt:
    name: str
    messages: tuple[dict[str, str], ...] | None  # chat messages (the chat template is applied)
    text: str | None  # raw text, encoded as is


@dataclass(frozen=True)
class PromptSet:
    name: str
    prompts: tuple[Prompt, ...]


def _parse(record: Any, where: str, index: int) -> Prompt:
    if isinstance(record, str):
        return Prompt(f"{index + 1}", ({"role": "user", "content": record},), None)
    if not isinstance(record, dict):
        raise CheckpointError(f"line {index + 1}: expected a JSON object or string", where)
    name = str(record.get("name") or record.get("id") or index + 1)
    if isinstance(record.get("prompt"), str):
        return Prompt(name, ({"role": "user", "content": record["prompt"]},), None)
    messages = record.get("messages")
    if isinstance(messages, list) and messages and all(
        isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str) for m in messages
    ):
        return Prompt(name, tuple({"role": m["role"], "content": m["content"]} for m in messages), None)
    if isinstance(record.get("text"), str):
        return Prompt(name, None, record["text"])
    raise CheckpointError(f"line {index + 1}: needs \"prompt\" (string), \"messages\" (list of role/content) "
                          "or \"text\" (raw, no chat template)", where)


def parse_jsonl(text: str, where: str) -> tuple[Prompt, ...]:
    """Prompts from JSONL text; `where` names the source in error messages."""
    prompts = []
    for index, line in enumerate(text.splitlines()):
        if not line.strip():
            continue
        record = parse_json(line, where, f"line {index + 1}")
        prompts.append(_parse(record, where, index))
    if not prompts:
        raise CheckpointError("no prompts in the file", where)
    return tuple(prompts)


def bundled_prompts() -> PromptSet:
    """The coding prompts shipped with eaglekit (in the spirit of SPEED-Bench's coding split)."""
    text = resources.files("eaglekit").joinpath("data", "prompts", "coding.jsonl").read_text(encoding="utf-8")
    return PromptSet(BUNDLED_NAME, parse_jsonl(text, "eaglekit/data/prompts/coding.jsonl"))


def read_prompts(path: str) -> PromptSet:
    """A JSONL file: one {"prompt": ...} / {"messages": [...]} / {"text": ...} per line, optional "name"."""
    try:
        text = read_bounded(path, "prompts file").decode("utf-8")
    except UnicodeDecodeError:
        raise CheckpointError("prompts file is not UTF-8 text", path) from None
    return PromptSet(os.path.splitext(os.path.basename(path))[0], parse_jsonl(text, path))


def source_context(tokenizer, num_tokens: int, index: int = 0, modules: Sequence[str] = CONTEXT_MODULES) -> str:
    """Exactly `num_tokens` target tokens of standard-library source (module chosen by `index`)."""
    pieces: list[int] = []
    for step in range(len(modules)):
        module = importlib.import_module(modules[(index + step) % len(modules)])
        pieces += tokenizer.encode(inspect.getsource(module), add_special_tokens=False)
        if len(pieces) >= num_tokens:
            break
    if len(pieces) < num_tokens:
        raise UsageError(f"--context-tokens {num_tokens}: the bundled source text has only {len(pieces)} tokens")
    return tokenizer.decode(pieces[:num_tokens])


def encode(prompt: Prompt, tokenizer, *, context_tokens: int = 0, index: int = 0,
           modules: Sequence[str] = CONTEXT_MODULES) -> list[int]:
    """Token ids for one prompt (chat template applied to messages), with optional long context prepended.

    `modules` are the standard-library modules the context is cut from (training uses others than verify)."""
    if tokenizer is None:
        raise UsageError("the target has no tokenizer: it is needed to encode the prompts")
    context = source_context(tokenizer, context_tokens, index, modules) if context_tokens > 0 else None
    if prompt.messages is not None and getattr(tokenizer, "chat_template", None):
        messages = [dict(m) for m in prompt.messages]
        if context is not None:
            messages[-1]["content"] = CONTEXT_TEMPLATE.format(context=context, prompt=messages[-1]["content"])
        ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_dict=True)["input_ids"]
        return list(ids)
    text = prompt.text if prompt.text is not None else "\n".join(m["content"] for m in prompt.messages)
    if context is not None:
        text = CONTEXT_TEMPLATE.format(context=context, prompt=text)
    return list(tokenizer(text)["input_ids"])
