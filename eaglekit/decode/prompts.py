"""Prompt sets for verify: the bundled coding prompts, a user's JSONL file, a long-context mode and templates.

Long context prepends real Python source (from standard-library modules, read with `inspect.getsource`
at run time) cut to an exact number of target tokens, so acceptance can be compared at short and long
context with everything else equal. A template says how the prompt reaches the target (its chat template, the
chat template under another system message, or plain text without one), so acceptance can be compared across
prompt shapes a draft was not trained on.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import inspect
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from importlib import resources
from typing import Any

from eaglekit.decode import speedbench
from eaglekit.decode.speedbench import SpeedBenchRow
from eaglekit.errors import CheckpointError, UsageError
from eaglekit.io.jsonfile import parse_json, read_bounded
from eaglekit.target import GEOMETRY_LIMITS

BUNDLED_NAME = "eaglekit-coding"
CONTEXT_MODULES = (
    "textwrap", "json.decoder", "argparse", "dataclasses", "functools", "heapq", "difflib", "shlex",
    "fractions", "statistics", "calendar", "ipaddress", "pprint", "string", "bisect", "csv",
)
CONTEXT_TEMPLATE = "Here is some Python source code for reference:\n\n```python\n{context}\n```\n\n{prompt}"
SYSTEM_MESSAGE = "You are a terse senior engineer. Answer with code first."
RAW_QUESTION, RAW_ANSWER = "Q: ", "A:"


@dataclass(frozen=True)
class Prompt:
    name: str
    messages: tuple[dict[str, str], ...] | None  # chat messages (the chat template is applied)
    text: str | None  # raw text, encoded as is
    category: str | None = None
    conversation: str | None = None  # turns of one conversation share it: resampled together in intervals
    follow_ups: tuple[str, ...] = ()  # later user turns, asked after the target's own answer to this one
    file: str | None = field(default=None, compare=False)  # where it was read, and its record there ("line 3"),
    record: str | None = field(default=None, compare=False)  # for messages: not part of what the prompt is

    def next_turn(self, answer: str) -> "Prompt":
        """The following turn: this conversation, the target's answer, then the next user turn."""
        turn = len([m for m in _messages(self) if m["role"] == "user"]) + 1
        messages = (*_messages(self), {"role": "assistant", "content": answer},
                    {"role": "user", "content": self.follow_ups[0]})
        return Prompt(f"{self.conversation}#turn{turn}", messages, None, self.category, self.conversation,
                      self.follow_ups[1:], self.file, self.record)

    @property
    def label(self) -> str:
        """How a message names it: its record in its file (and the turn, for a later one), else its name."""
        if self.record is None:
            return f"prompt {self.name!r}"[:120]
        return self.record if self.name == (self.conversation or self.name) else f"{self.record}, {self.name}"[:160]


class PromptTokens(list):
    """A prompt's token ids that remember which prompt they encode, so a check made later (the target's context
    against the generation length) can name it."""

    def __init__(self, ids, prompt: Prompt | None = None):
        super().__init__(ids)
        self.prompt = prompt


@dataclass(frozen=True)
class PromptSet:
    name: str
    prompts: tuple[Prompt, ...]
    speed_bench: bool = False

    @property
    def turns(self) -> int:
        """Decodes this set asks for: every prompt and each of its follow-up turns."""
        return sum(1 + len(p.follow_ups) for p in self.prompts)


def _parse(record: Any, where: str, index: int) -> Prompt:
    line = f"line {index + 1}"
    if isinstance(record, str):
        return Prompt(f"{index + 1}", ({"role": "user", "content": record},), None, file=where, record=line)
    if not isinstance(record, dict):
        raise CheckpointError(f"line {index + 1}: expected a JSON object or string", where)
    name = str(record.get("name") or record.get("id") or index + 1)
    category = record["category"] if isinstance(record.get("category"), str) else None
    if isinstance(record.get("prompt"), str):
        return Prompt(name, ({"role": "user", "content": record["prompt"]},), None, category, name, file=where,
                      record=line)
    messages = record.get("messages")
    if isinstance(messages, list) and messages and all(
        isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str) for m in messages
    ):
        return Prompt(name, tuple({"role": m["role"], "content": m["content"]} for m in messages), None, category,
                      name, file=where, record=line)
    if isinstance(record.get("text"), str):
        return Prompt(name, None, record["text"], category, name, file=where, record=line)
    raise CheckpointError(f"line {index + 1}: needs \"prompt\" (string), \"messages\" (list of role/content) "
                          "or \"text\" (raw, no chat template)", where)


def _records(text: str, where: str) -> list[tuple[int, Any]]:
    return [(index, parse_json(line, where, f"line {index + 1}"))
            for index, line in enumerate(text.splitlines()) if line.strip()]


def parse_jsonl(text: str, where: str) -> tuple[Prompt, ...]:
    """Prompts from JSONL text; `where` names the source in error messages."""
    prompts = tuple(_parse(record, where, index) for index, record in _records(text, where))
    if not prompts:
        raise CheckpointError("no prompts in the file", where)
    return prompts


def from_speed_bench(rows: Sequence[SpeedBenchRow], turns: str, where: str | None = None) -> tuple[Prompt, ...]:
    """One prompt per conversation: its first user turn, with the later ones as follow-ups under --turns all."""
    return tuple(Prompt(row.question_id, ({"role": "user", "content": row.turns[0]},), None, row.category,
                        row.question_id, row.turns[1:] if turns == "all" else (), where,
                        f"question_id {row.question_id!r}"[:120])
                 for row in rows)


def _filter_categories(prompts: tuple[Prompt, ...], categories: Sequence[str], where: str) -> tuple[Prompt, ...]:
    known = sorted({p.category for p in prompts if p.category is not None})
    unknown = [c for c in categories if c not in known]
    if unknown:
        has = f"it has {', '.join(known)}" if known else "its prompts have no \"category\""
        raise UsageError(f"--category {', '.join(unknown)}: not in {where} ({has})")
    return tuple(p for p in prompts if p.category in categories)


def bundled_prompts() -> PromptSet:
    """The coding prompts shipped with eaglekit (in the spirit of SPEED-Bench's coding split)."""
    text = (resources.files("eaglekit") / "data" / "prompts" / "coding.jsonl").read_text(encoding="utf-8")
    return PromptSet(BUNDLED_NAME, parse_jsonl(text, "eaglekit/data/prompts/coding.jsonl"))


def read_prompts(path: str, categories: Sequence[str] = (), turns: str = "first") -> PromptSet:
    """A JSONL file (one {"prompt": ...} / {"messages": [...]} / {"text": ...} per line, optional "name" and
    "category"), or a prepared SPEED-Bench file (JSONL or parquet), recognised by its rows."""
    speedbench.check_turns(turns)
    name = os.path.splitext(os.path.basename(path))[0]
    if path.endswith(".parquet"):
        rows = speedbench.select(speedbench.read_speed_bench(path), categories, path)
        return PromptSet(name, from_speed_bench(rows, turns, path), speed_bench=True)
    try:
        text = read_bounded(path, "prompts file", speedbench.MAX_BYTES).decode("utf-8")
    except UnicodeDecodeError:
        raise CheckpointError("prompts file is not UTF-8 text", path) from None
    records = _records(text, path)
    if records and speedbench.looks_like_speed_bench(path, records[0][1]):
        rows = speedbench.select(speedbench.read_speed_bench(path, [r for _, r in records]), categories, path)
        return PromptSet(name, from_speed_bench(rows, turns, path), speed_bench=True)
    if turns != "first":
        raise UsageError(f"--turns {turns}: needs a SPEED-Bench file (rows with \"turns\"); {path} has none")
    if not records:
        raise CheckpointError("no prompts in the file", path)
    prompts = tuple(_parse(record, path, index) for index, record in records)
    return PromptSet(name, _filter_categories(prompts, categories, path) if categories else prompts)


def source_context(tokenizer, num_tokens: int, index: int = 0, modules: Sequence[str] = CONTEXT_MODULES) -> str:
    """Exactly `num_tokens` target tokens of standard-library source (module chosen by `index`)."""
    pieces: list[int] = []
    for step in range(len(modules)):
        module = importlib.import_module(modules[(index + step) % len(modules)])
        pieces += tokenizer.encode(inspect.getsource(module), add_special_tokens=False, verbose=False)
        if len(pieces) >= num_tokens:
            break
    if len(pieces) < num_tokens:
        raise UsageError(f"--context-tokens {num_tokens}: the bundled source text has only {len(pieces)} tokens")
    return tokenizer.decode(pieces[:num_tokens])


def with_context(prompt: Prompt, tokenizer, context_tokens: int, index: int = 0,
                 modules: Sequence[str] = CONTEXT_MODULES) -> Prompt:
    """The prompt with `context_tokens` of source prepended to its last user message (or its text), so later
    turns of a conversation keep the context their first turn was asked with."""
    if context_tokens <= 0:
        return prompt
    context = source_context(tokenizer, context_tokens, index, modules)
    if prompt.text is not None:
        return dataclasses.replace(prompt, text=CONTEXT_TEMPLATE.format(context=context, prompt=prompt.text))
    messages = [dict(m) for m in _messages(prompt)]
    messages[-1]["content"] = CONTEXT_TEMPLATE.format(context=context, prompt=messages[-1]["content"])
    return dataclasses.replace(prompt, messages=tuple(messages))


def _messages(prompt: Prompt) -> tuple[dict[str, str], ...]:
    return prompt.messages if prompt.messages is not None else ({"role": "user", "content": prompt.text or ""},)


def as_chat(prompt: Prompt) -> Prompt:
    """The prompt as written: messages through the target's chat template, text as is."""
    return prompt


def with_system(prompt: Prompt) -> Prompt:
    """The chat template with SYSTEM_MESSAGE as the system message, in place of the prompt's own (or the template's
    default); a text prompt becomes the user message."""
    turns = tuple(dict(m) for m in _messages(prompt) if m["role"] != "system")
    return dataclasses.replace(prompt, messages=({"role": "system", "content": SYSTEM_MESSAGE}, *turns), text=None)


def as_raw(prompt: Prompt) -> Prompt:
    """No chat template: plain "Q: {user text}\nA:" text, the shape a base model continues. Earlier turns keep
    their answers ("A: ..."), a system message stays as a plain first line."""
    lines = []
    for m in _messages(prompt):
        prefix = {"user": RAW_QUESTION, "assistant": RAW_ANSWER + " "}.get(m["role"], "")
        lines.append(prefix + m["content"])
    return dataclasses.replace(prompt, messages=None, text="\n".join([*lines, RAW_ANSWER]))


@dataclass(frozen=True)
class Template:
    apply: Callable[[Prompt], Prompt]
    description: str


TEMPLATES = {
    "chat": Template(as_chat, "the target's chat template with the prompt's own messages"),
    "system": Template(with_system, f"the chat template with the system message {SYSTEM_MESSAGE!r} (replacing the "
                                    "prompt's own or the template's default)"),
    "raw": Template(as_raw, f"no chat template: the plain text \"{RAW_QUESTION}<user message>\\n{RAW_ANSWER}\""),
}
"""Prompt conditions by name: how each prompt reaches the target (verify and compare --template)."""


def check_template(name: str) -> None:
    if name not in TEMPLATES:
        raise UsageError(f"--template {name!r}: use one of {', '.join(TEMPLATES)}")


def with_template(prompt: Prompt, template: str) -> Prompt:
    check_template(template)
    return TEMPLATES[template].apply(prompt)


def target_context(tokenizer) -> int | None:
    """The target's context in tokens as its tokenizer carries it (load_target sets `model_max_length` from
    max_position_embeddings); None where unstated (transformers' placeholder is 10^30)."""
    value = getattr(tokenizer, "model_max_length", None)
    limit = GEOMETRY_LIMITS["max_position_embeddings"]
    return value if isinstance(value, int) and not isinstance(value, bool) and 0 < value <= limit else None


@functools.lru_cache(maxsize=4)
def longest_token_chars(tokenizer) -> int:
    """The most characters one token can stand for (its longest vocabulary entry, which spells a byte-level token
    one character per byte): n tokens never cover more than n times this many characters."""
    return max(1, max(map(len, tokenizer.get_vocab()), default=1))


def leading_text(text: str, tokenizer, tokens: int) -> str:
    """The start of `text` that holds at least its first `tokens` tokens: what to tokenize of an unbounded text
    that is cut to that many tokens anyway."""
    return text[: tokens * longest_token_chars(tokenizer)]


def _characters(prompt: Prompt) -> int:
    return len(prompt.text) if prompt.text is not None else sum(len(m["content"]) for m in _messages(prompt))


def _cut(prompt: Prompt, chars: int) -> Prompt:
    """The prompt's first `chars` characters of content (later messages dropped, the last kept one shortened)."""
    if prompt.text is not None:
        return dataclasses.replace(prompt, text=prompt.text[:chars])
    kept = []
    for m in _messages(prompt):
        if chars <= 0:
            break
        kept.append({"role": m["role"], "content": m["content"][:chars]})
        chars -= len(m["content"])
    return dataclasses.replace(prompt, messages=tuple(kept))


def render_text(prompt: Prompt, tokenizer) -> str:
    """The text a server receives for `prompt`, tokenised there: the target's chat template applied to its
    messages (what encode tokenises), or its raw text."""
    if prompt.messages is not None and getattr(tokenizer, "chat_template", None):
        return tokenizer.apply_chat_template([dict(m) for m in prompt.messages], add_generation_prompt=True,
                                             tokenize=False)
    return prompt.text if prompt.text is not None else "\n".join(m["content"] for m in _messages(prompt))


def encode(prompt: Prompt, tokenizer, *, context_tokens: int = 0, index: int = 0,
           modules: Sequence[str] = CONTEXT_MODULES, template: str = "chat",
           max_tokens: int | None = None) -> PromptTokens:
    """Token ids for one prompt (chat template applied to messages), with optional long context prepended and the
    prompt put in the shape `template` names (TEMPLATES).

    A prompt longer than the target's context (target_context) is refused naming its file and record: measured
    in characters before any tokenizer call (a 50 MB line never reaches it), then in tokens. With `max_tokens`
    (training, which cuts long sequences) it is cut to that many tokens instead, its characters first.
    `modules` are the standard-library modules the context is cut from (training uses others than verify)."""
    if tokenizer is None:
        raise UsageError("the target has no tokenizer: it is needed to encode the prompts")
    prompt = with_template(with_context(prompt, tokenizer, context_tokens, index, modules), template)
    context = target_context(tokenizer)
    bound = max_tokens if max_tokens is not None else context
    if bound is not None:
        chars = bound * longest_token_chars(tokenizer)
        if max_tokens is not None:
            prompt = _cut(prompt, chars)
        elif _characters(prompt) > chars:
            raise CheckpointError(f"{prompt.label}: {_characters(prompt):,} characters cannot fit the target's "
                                  f"{context:,}-token context (max_position_embeddings; its longest token spells "
                                  f"{longest_token_chars(tokenizer)} characters): shorten or drop it", prompt.file)
    if prompt.messages is not None and getattr(tokenizer, "chat_template", None):
        messages = [dict(m) for m in prompt.messages]
        ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_dict=True,
                                            tokenizer_kwargs={"verbose": False})["input_ids"]
    else:
        text = prompt.text if prompt.text is not None else "\n".join(m["content"] for m in _messages(prompt))
        ids = tokenizer(text, verbose=False)["input_ids"]
    if max_tokens is not None:
        return PromptTokens(ids[:max_tokens], prompt)
    if context is not None and len(ids) > context:
        raise CheckpointError(f"{prompt.label}: the prompt is {len(ids):,} tokens with the {template} template, more "
                              f"than the target's {context:,}-token context (max_position_embeddings): shorten or "
                              "drop it", prompt.file)
    return PromptTokens(ids, prompt)
