"""Self-distillation data: token sequences, the target's greedy token at every position, and its aux states.

One target forward per sequence gives everything training needs: the aux hidden states the draft reads (vLLM
convention, captured by the target adapter's hooks) and the target's own greedy prediction after each
position, which is the label. `--generate` first appends the target's greedy answer to each prompt, so the
text is the target's own (what a served draft sees after the prompt). Captured data is cached on disk under
a content address (target bytes, aux ids, token ids, options); a cache file is written under a temporary
name and renamed, so a partial one is never read as complete.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
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
from eaglekit.errors import CheckpointError, OutputError, UsageError
from eaglekit.progress import Progress, quiet

DATA_FORMAT = "1"
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



@dataclass(frozen=True)
class DataOptions:
    data_file: str | None = None  # JSONL prompts (verify's format); None: the bundled training prompts
    limit: int | None = None  # first N records only
    generate: int = 0  # append the target's greedy answer, up to this many tokens (0: the text as is)
    context_tokens: int = 0  # long context prepended to every `context_every`-th prompt
    context_every: int = 4
    max_length: int = 2048  # longer sequences are cut (and at the target's context, when that is shorter)
    code_tokens: int = 0  # add about this many tokens of standard-library source as plain text
    templates: tuple[str, ...] = ("chat",)  # prompt shapes (verify's TEMPLATES), one per prompt in turn
    hidden_states: str | None = None  # states captured elsewhere (vLLM extract_hidden_states files)
    captured_ids: tuple[int, ...] | None = None  # the layer ids vLLM captured into those files (default: the draft's)
    cache_dir: str | None = None  # default: $EAGLEKIT_CACHE/finetune or ~/.cache/eaglekit/finetune

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
        if self.captured_ids is not None and not self.hidden_states:
            raise UsageError("--captured-ids names the layers vLLM captured into --hidden-states: give --hidden-states "
                             "too, or drop --captured-ids")
        if self.hidden_states and (self.data_file or self.generate or self.context_tokens or self.code_tokens
                                   or self.templates != ("chat",)):
            raise UsageError("--hidden-states brings its own sequences: it cannot be combined with --data, "
                             "--generate, --context-tokens, --code-tokens or --templates")


@dataclass
class TrainingData:
    """Rows of every sequence, concatenated: tokens [N], labels [N], aux [N, K*T] (bf16), offsets [S+1]; from a
    store with soft targets also the teacher's top-k next tokens [N, k] and their probabilities [N, k]."""

    tokens: Any
    labels: Any
    aux: Any
    offsets: Any
    digest: str
    source: str
    cache_path: str | None = None
    reused: bool = False
    seconds: float = 0.0
    notes: list[str] = field(default_factory=list)
    soft_ids: Any = None
    soft_probs: Any = None

    @property
    def sequences(self) -> int:
        return int(self.offsets.numel()) - 1

    @property
    def positions(self) -> int:
        return int(self.tokens.numel())

    def to_dict(self) -> dict[str, Any]:
        return {"source": self.source, "sequences": self.sequences, "positions": self.positions,
                "sha256": self.digest, "cache": self.cache_path, "reused": self.reused,
                "seconds": round(self.seconds, 3), "notes": list(self.notes)}


def split_validation(data: TrainingData, fraction: float) -> tuple[TrainingData, TrainingData | None]:
    """(training part, held-out part): every round(1/fraction)-th whole sequence is held out for selecting the
    checkpoint, so it is never trained on. None when there are too few sequences to spare one."""
    import torch

    if fraction <= 0 or data.sequences < 2:
        return data, None
    every = max(2, round(1 / fraction))
    picked = [i for i in range(data.sequences) if i % every == every - 1] or [data.sequences - 1]
    held = set(picked)
    rest = [i for i in range(data.sequences) if i not in held]

    def subset(indices: list[int], part: str) -> TrainingData:
        offsets = data.offsets.tolist()
        rows = torch.cat([torch.arange(offsets[i], offsets[i + 1]) for i in indices])
        lengths = torch.tensor([offsets[i + 1] - offsets[i] for i in indices])
        soft = {} if data.soft_ids is None else {"soft_ids": data.soft_ids[rows], "soft_probs": data.soft_probs[rows]}
        return dataclasses.replace(data, tokens=data.tokens[rows], labels=data.labels[rows], aux=data.aux[rows],
                                   offsets=torch.cat([torch.zeros(1, dtype=torch.long), lengths.cumsum(0)]),
                                   source=f"{data.source} ({part})", **soft)

    return subset(rest, "training part"), subset(picked, "held-out part")


def default_cache_dir() -> str:
    root = os.environ.get("EAGLEKIT_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "eaglekit")
    return os.path.join(root, "finetune")


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


def target_identity(target_dir: str) -> dict[str, str]:
    """SHA-256 of the target's config and weight files: what the captured states depend on."""
    from eaglekit.provenance import sha256_file

    names = sorted(n for n in os.listdir(target_dir) if n == "config.json" or n.endswith(".safetensors"))
    return {n: sha256_file(os.path.join(target_dir, n)) for n in names}


def content_address(parts: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(parts, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def left_padded(prompts: Sequence[Sequence[int]], pad: int):
    """(input ids, attention mask) [B, W] of prompts padded on the left, as batched generation wants them."""
    import torch

    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad, dtype=torch.long)
    mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for row, prompt in enumerate(prompts):
        ids[row, width - len(prompt):] = torch.tensor(prompt)
        mask[row, width - len(prompt):] = 1
    return ids, mask


def generate_answers(target, prompts: list[list[int]], max_new_tokens: int, *, batch_tokens: int = 8192,
                     progress: Progress | None = None) -> list[list[int]]:
    """The target's greedy continuation of each prompt (left-padded batches of similar length); `progress` counts
    the tokens of every sequence as each generate step makes them, not only when a batch ends."""
    import torch
    from transformers import StoppingCriteria, StoppingCriteriaList

    sink = quiet(progress)
    sink.stage(f"generating answers to {len(prompts):,} prompts", len(prompts) * max_new_tokens, "tokens")

    class EveryStep(StoppingCriteria):  # called once per generated token of the batch: it only reports
        def __call__(self, input_ids, scores, **kwargs):
            sink.advance(int(input_ids.shape[0]))
            return torch.zeros(input_ids.shape[0], dtype=torch.bool, device=input_ids.device)

    eos = sorted(target.eos_token_ids)
    pad = eos[0] if eos else 0
    order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))
    answers: list[list[int]] = [[] for _ in prompts]
    done = 0
    while done < len(order):
        width = len(prompts[order[done]]) + max_new_tokens
        size = max(1, batch_tokens // width)
        idx = order[done : done + size]
        ids, mask = left_padded([prompts[i] for i in idx], pad)
        width = ids.shape[1]
        with torch.inference_mode():
            out = target.model.generate(input_ids=ids.to(target.device), attention_mask=mask.to(target.device),
                                        max_new_tokens=max_new_tokens, do_sample=False, pad_token_id=pad,
                                        eos_token_id=eos or None, temperature=None, top_p=None, top_k=None,
                                        stopping_criteria=StoppingCriteriaList([EveryStep()]))
        for row, i in enumerate(idx):
            tokens = out[row, width:].tolist()
            stop = next((n for n, t in enumerate(tokens) if t in eos), None)
            answers[i] = tokens if stop is None else tokens[: stop + 1]
        done += len(idx)
        sink.advance(len(idx) * max_new_tokens - len(idx) * (out.shape[1] - width))  # rows stopped early
    sink.done()
    return answers


def capture(target, sequences: list[list[int]], aux_ids: Sequence[int], *,
            progress: Progress | None = None) -> dict[str, Any]:
    """One target pass per sequence: labels (greedy next token at every position) and aux states (bf16)."""
    import torch

    progress = quiet(progress)
    progress.stage(f"capturing target states on {sum(map(len, sequences)):,} tokens", len(sequences), "sequences")
    ids = tuple(sorted(aux_ids))
    tokens, labels, aux, offsets = [], [], [], [0]
    for seq in sequences:
        result = target.forward(torch.tensor([seq]), ids)
        tokens.append(torch.tensor(seq, dtype=torch.long))
        labels.append(result.logits[0].argmax(-1).to("cpu", torch.long))
        aux.append(torch.cat([a[0] for a in result.aux], -1).to("cpu", torch.bfloat16))
        offsets.append(offsets[-1] + len(seq))
        progress.advance()
    return {"tokens": torch.cat(tokens), "labels": torch.cat(labels), "aux": torch.cat(aux),
            "offsets": torch.tensor(offsets, dtype=torch.long)}


def _digest(data: dict[str, Any]) -> str:
    """SHA-256 of the sequences' bytes (tokens, labels, boundaries) of data read from elsewhere."""
    digest = hashlib.sha256()
    for key in ("tokens", "labels", "offsets"):
        digest.update(data[key].contiguous().numpy().tobytes())
    return digest.hexdigest()


def _load_cached(path: str, digest: str) -> dict[str, Any] | None:
    from safetensors import SafetensorError, safe_open
    from safetensors.torch import load_file

    if not os.path.isfile(path):
        return None
    try:
        with safe_open(path, "pt") as fh:
            meta = fh.metadata() or {}
        if meta.get("eaglekit_data") != DATA_FORMAT or meta.get("sha256") != digest:
            return None
        data = load_file(path)
    except (SafetensorError, OSError, ValueError):
        return None  # unreadable: rebuilt and replaced below
    if set(data) != {"tokens", "labels", "aux", "offsets"}:
        return None
    return data


def _save_cached(path: str, digest: str, data: dict[str, Any]) -> None:
    """Published atomically (io.publish): a killed run leaves no file that looks complete."""
    from eaglekit.io.publish import publish
    from eaglekit.io.writer import save_tensors

    publish(path, lambda stage: save_tensors({k: v.contiguous() for k, v in data.items()}, stage.path,
                                             metadata={"eaglekit_data": DATA_FORMAT, "sha256": digest}),
            replace=True, what="the captured data", make_parents=True)  # content-addressed: any run's file is this one


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


def build_data(target, target_dir: str, aux_ids: Sequence[int], opts: DataOptions, *,
               progress: Progress | None = None) -> TrainingData:
    """Captured training data for `aux_ids` (vLLM convention), from the cache when the same data was built."""
    opts.check()
    started = time.perf_counter()
    if opts.hidden_states:
        from eaglekit.finetune.hidden_states import read_captured_states

        captured: dict[str, Any] = read_captured_states(opts.hidden_states, aux_ids, captured_ids=opts.captured_ids)
        return TrainingData(**captured, digest=_digest(captured), source=os.path.abspath(opts.hidden_states),
                            seconds=time.perf_counter() - started)

    plan = plan_sequences(target.tokenizer, opts, progress=progress)
    digest = content_address({
        "format": DATA_FORMAT, "target": target_identity(target_dir), "dtype": str(target.dtype),
        "quantization": target.quantization.name if target.quantization else None,
        "aux_ids": sorted(int(i) for i in aux_ids), "generate": opts.generate, "max_length": opts.max_length,
        "sequences": hashlib.sha256(json.dumps(plan.prompts).encode()).hexdigest(),
        "code": hashlib.sha256(json.dumps(plan.code).encode()).hexdigest(),
    })
    cache_dir = opts.cache_dir or default_cache_dir()
    path = os.path.join(cache_dir, f"{digest}.safetensors")
    data = _load_cached(path, digest)
    cache_path: str | None = path
    reused, notes = data is not None, list(plan.notes)
    if data is None:
        sequences = plan.complete(opts, lambda prompts, n: generate_answers(target, prompts, n, progress=progress))
        data = capture(target, sequences, aux_ids, progress=progress)
        try:
            _save_cached(path, digest, data)
        except (OSError, OutputError) as exc:  # training goes on without a cache
            notes.append(f"captured data not cached ({exc})")
            cache_path = None
    source = plan.source
    return TrainingData(**data, digest=digest, source=source, cache_path=cache_path, reused=reused,
                        seconds=time.perf_counter() - started, notes=notes)
