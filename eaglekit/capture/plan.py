"""The data plan of a capture: which token sequences the target runs on, before it runs.

Training data (finetune, `capture`): prompts from --data or the bundled training prompts, shaped by templates,
with long context on some, cut to the target's context, plus chunks of standard-library source; `--generate`
appends the target's own greedy answer, asked of whichever backend runs the target. Calibration text (upgrade,
`capture --calibration`): the bundled prose-and-code sample or a user file, its last quarter held out.
"""

from __future__ import annotations

import codecs
import hashlib
import json
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from importlib import resources
from typing import Any

from eaglekit.decode.prompts import (
    CONTEXT_MODULES,
    Prompt,
    check_template,
    encode,
    parse_jsonl,
    read_prompts,
    target_context,
)
from eaglekit.errors import CheckpointError, UsageError
from eaglekit.io.jsonfile import open_regular
from eaglekit.progress import Progress, quiet

BUNDLED_DATA = "eaglekit/data/prompts/train.jsonl"
TRAINING_CONTEXT_MODULES = ("shutil", "tempfile", "logging", "glob", "fnmatch", "locale", "gettext", "tokenize",
                            "zipfile", "tarfile", "configparser", "optparse", "random", "timeit", "traceback", "copy")
"""Long-context text for training: never the modules verify's held-out long-context prompts use."""
CODE_MODULES = ("os", "posixpath", "subprocess", "threading", "queue", "socket", "email.message", "http.client",
                "urllib.parse", "pathlib", "enum", "typing", "abc", "contextlib", "operator", "ast", "inspect",
                "pickletools", "gzip", "base64", "hashlib", "hmac", "secrets", "uuid", "datetime", "decimal",
                "numbers", "colorsys", "wave", "sched", "selectors", "asyncio.tasks", "asyncio.queues",
                "concurrent.futures._base", "multiprocessing.pool", "unittest.case", "doctest", "pdb", "cmd", "code")
"""Plain source-code text for training (--code-tokens), disjoint from both context lists."""
assert not set(TRAINING_CONTEXT_MODULES) & set(CONTEXT_MODULES)
assert not set(CODE_MODULES) & (set(CONTEXT_MODULES) | set(TRAINING_CONTEXT_MODULES))

SEQUENCE_LENGTH = 256
HELD_OUT_FRACTION = 0.25
CALIBRATION_READ_BYTES = 16 * 1024 * 1024
"""Read of a calibration file at most: the calibration tokens (a few thousand) never spell more, so a larger file is
used for its start; a FIFO or device is refused (open_regular)."""


@dataclass(frozen=True)
class DataOptions:
    """What the training sequences are planned from (finetune and `capture`; fixed by a store's plan once
    captured)."""

    data_file: str | None = None  # JSONL prompts (verify's format); None: the bundled training prompts
    limit: int | None = None  # first N records only
    generate: int = 0  # append the target's greedy answer, up to this many tokens (0: the text as is)
    context_tokens: int = 0  # long context prepended to every `context_every`-th prompt
    context_every: int = 4
    max_length: int = 2048  # longer sequences are cut (and at the target's context, when that is shorter)
    code_tokens: int = 0  # add about this many tokens of standard-library source as plain text
    templates: tuple[str, ...] = ("chat",)  # prompt shapes (verify's TEMPLATES), one per prompt in turn

    def check(self) -> None:
        if not self.templates:
            raise UsageError("--templates needs at least one template")
        for template in self.templates:
            check_template(template)
        for name in ("generate", "context_tokens", "code_tokens"):
            if getattr(self, name) < 0:
                raise UsageError(f"--{name.replace('_', '-')} must not be negative")
        if self.context_every < 1:
            raise UsageError("--context-every must be at least 1")
        if self.max_length < 2:
            raise UsageError("--max-length must be at least 2")
        if self.limit is not None and self.limit < 1:
            raise UsageError("--data-limit must be at least 1")


def training_prompts(opts: DataOptions) -> tuple[str, tuple[Prompt, ...]]:
    """(name, prompts) from --data or the bundled training prompts (disjoint from verify's held-out prompts)."""
    if opts.data_file:
        prompts = read_prompts(opts.data_file).prompts
        name = os.path.abspath(opts.data_file)
    else:
        text = (resources.files("eaglekit") / "data" / "prompts" / "train.jsonl").read_text(encoding="utf-8")
        prompts, name = parse_jsonl(text, BUNDLED_DATA), BUNDLED_DATA
    return name, prompts[: opts.limit] if opts.limit else prompts


def sequence_limit(tokenizer, opts: DataOptions) -> int:
    """Tokens a training sequence keeps: --max-length, and never more than the target's context (the positions
    it was trained on), since its states past there are not what a served draft reads."""
    context = target_context(tokenizer)
    return min(opts.max_length, context) if context is not None else opts.max_length


def encode_all(prompts: Sequence[Prompt], tokenizer, opts: DataOptions, where: str) -> list[list[int]]:
    """Token ids per prompt, cut to sequence_limit (an unbounded record is cut in characters before it is
    tokenized); every `context_every`-th one (from the first) gets long context, and prompt i the template
    `templates[i % len(templates)]`."""
    out = []
    for i, prompt in enumerate(prompts):
        context = opts.context_tokens if opts.context_tokens and i % opts.context_every == 0 else 0
        ids = encode(prompt, tokenizer, context_tokens=context, index=i, modules=TRAINING_CONTEXT_MODULES,
                     template=opts.templates[i % len(opts.templates)], max_tokens=sequence_limit(tokenizer, opts))
        if len(ids) < 2:
            raise CheckpointError(f"record {i + 1} ({prompt.name!r}) encodes to {len(ids)} token(s); "
                                  "training needs at least 2", where)
        out.append(list(ids))
    return out


def code_sequences(tokenizer, total: int, chunk: int) -> list[list[int]]:
    """About `total` tokens of standard-library source in chunks of `chunk` tokens (raw text, no template)."""
    import importlib
    import inspect

    out, count = [], 0
    for name in CODE_MODULES:
        ids = tokenizer.encode(inspect.getsource(importlib.import_module(name)), add_special_tokens=False,
                               verbose=False)
        for start in range(0, len(ids) - chunk // 4, chunk):
            out.append(ids[start : start + chunk])
            count += len(out[-1])
            if count >= total:
                return out
    return out


def content_address(parts: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(parts, sort_keys=True, separators=(",", ":")).encode()).hexdigest()



@dataclass
class SequencePlan:
    """The sequences a capture runs the target on, before the target's own answers are appended."""

    name: str  # where the prompts came from
    prompts: list[list[int]]  # token ids per prompt, cut to `limit`
    code: list[list[int]]  # --code-tokens chunks (raw text)
    limit: int  # tokens a sequence keeps
    notes: list[str]
    source: str  # the data in words (for reports)

    def complete(self, opts: DataOptions, answer: Callable[[list[list[int]], int], list[list[int]]]
                 ) -> list[list[int]]:
        """Every sequence to capture: the prompts (each with the target's greedy answer under --generate, from
        `answer(prompts, max_new_tokens)`: the reference target's or the serving engine's), then the code chunks."""
        prompts = self.prompts
        if opts.generate:
            answers = answer(prompts, opts.generate)
            prompts = [(p + a)[: self.limit] for p, a in zip(prompts, answers)]
        return prompts + self.code


def plan_sequences(tokenizer, opts: DataOptions, *, progress: Progress | None = None) -> SequencePlan:
    """The training prompts encoded with the target's tokenizer (templates, context, cuts), plus code chunks."""
    name, prompts = training_prompts(opts)
    quiet(progress).stage(f"encoding {len(prompts):,} prompts of {name}")
    sequences = encode_all(prompts, tokenizer, opts, name)
    limit = sequence_limit(tokenizer, opts)
    code = code_sequences(tokenizer, opts.code_tokens, min(512, limit)) if opts.code_tokens else []
    notes = []
    cut = [p.label for p, ids in zip(prompts, sequences) if len(ids) >= limit]
    if limit < opts.max_length and cut:
        notes.append(f"{len(cut)} record(s) of {name} cut at the target's {limit:,}-token context "
                     f"(max_position_embeddings, below --max-length {opts.max_length:,}): "
                     f"{', '.join(cut[:5])}{', …' if len(cut) > 5 else ''}")
    source = name + (f", target answers up to {opts.generate} tokens" if opts.generate else "")
    if opts.context_tokens:
        source += f", {opts.context_tokens} tokens of context on every {opts.context_every}th"
    if opts.templates != ("chat",):
        source += f", templates {'/'.join(opts.templates)} in turn"
    if code:
        source += f", {sum(map(len, code))} tokens of standard-library source"
    return SequencePlan(name, sequences, code, limit, notes, source)


def calibration_text(path: str | None) -> tuple[str, str]:
    """(text, where it came from): a user file, or the bundled prose-and-code sample."""
    if path is None:
        return resources.files("eaglekit.data").joinpath("calibration.txt").read_text(encoding="utf-8"), "bundled"
    with open_regular(path, "calibration file") as fh:
        try:
            data = fh.read(CALIBRATION_READ_BYTES)
        except OSError as exc:
            raise UsageError(f"cannot read the calibration file ({exc.strerror or exc})", path) from None
    try:  # a character cut by the byte bound is dropped; an invalid one is refused
        return codecs.getincrementaldecoder("utf-8")().decode(data, final=len(data) < CALIBRATION_READ_BYTES), path
    except UnicodeDecodeError as exc:
        raise UsageError(f"the calibration file is not UTF-8 text (byte {exc.start})", path) from None


def _sequences(ids: list[int]) -> list[list[int]]:
    chunks = (ids[i:i + SEQUENCE_LENGTH] for i in range(0, len(ids), SEQUENCE_LENGTH))
    return [c for c in chunks if len(c) > 1]


def calibration_sequences(tokenizer, *, text_file: str | None = None, max_tokens: int = 2048
                          ) -> tuple[list[list[int]], list[list[int]], str]:
    """(fit sequences, held-out sequences, where the text came from): the calibration text's first `max_tokens`
    tokens, the last quarter held out, each part cut into SEQUENCE_LENGTH-token sequences."""
    from eaglekit.decode.prompts import leading_text

    text, where = calibration_text(text_file)
    ids = list(tokenizer(leading_text(text, tokenizer, max_tokens), add_special_tokens=True,
                         verbose=False)["input_ids"])[:max_tokens]
    held = max(SEQUENCE_LENGTH // 4, int(len(ids) * HELD_OUT_FRACTION))
    if len(ids) - held < 64:
        raise UsageError(f"calibration text is too short: {len(ids)} tokens (need at least {64 + held})", where)
    return _sequences(ids[:-held]), _sequences(ids[-held:]), where
