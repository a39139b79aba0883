"""Decoding, plain and speculative (chain of k drafts, one target verify per round): greedy, or sampled as vLLM's
rejection sampler samples (`eaglekit.decode.sampling`) when a `RejectionSampler` is given.

The speculative loop only talks to two small interfaces, so the same loop runs
- against the live target (`LiveVerifier`: real forwards, KV cache cropped on rejection) to measure
  speed and prove losslessness, and
- against one captured target pass (`ReplayVerifier`), to score a drafter under many hypotheses
  without running the target again (`diagnose`).

A `Proposer` is anything that drafts tokens: the EAGLE drafter, or the oracle and random proposers
that bracket the metrics.
"""

from __future__ import annotations

import random
import time
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from eaglekit.decode.metrics import AcceptanceCounter
from eaglekit.decode.prefix import SharedPrefix
from eaglekit.errors import CheckpointError
from eaglekit.progress import Progress, quiet
from eaglekit.target_model import TargetModel

if TYPE_CHECKING:
    from eaglekit.decode.sampling import RejectionSampler


@dataclass
class VerifyStep:
    """What the target says about a block of input rows."""

    predictions: list[int]  # the target's greedy token after each row
    aux: list[Any]  # [rows, T] per aux id, ascending id order
    logits: Any = None  # [rows, V], where the verifier runs the target (a sampled decode reads them)


class Verifier(Protocol):
    aux_ids: tuple[int, ...]

    def prefill(self, prompt: Sequence[int]) -> VerifyStep:
        """Run the prompt; predictions hold only the token after its last row, aux covers every row."""

    def verify(self, tokens: Sequence[int]) -> VerifyStep:
        """Run `tokens` after everything committed so far."""

    def commit(self, length: int) -> None:
        """Keep the first `length` positions (drop rows of rejected drafts)."""


class Proposer(Protocol):
    aux_ids: tuple[int, ...]  # the target states it reads; () for none

    def begin(self, prompt: Sequence[int], aux: list[Any], next_token: int) -> None:
        """Start a sequence: prompt tokens, their aux states [S, T] and the target's first token."""

    def propose(self, k: int) -> list[int]:
        """Draft the next k tokens after everything committed."""

    def advance(self, accepted: Sequence[int], bonus: int, aux: list[Any]) -> None:
        """The target kept `accepted` drafts and added `bonus`; `aux` holds [len(accepted)+1, T] per id
        for the verified rows (the last committed token, then the accepted drafts)."""


@dataclass
class Clock:
    """Seconds spent in the target, in the proposer, and in total (bookkeeping included)."""

    target_s: float = 0.0
    draft_s: float = 0.0
    total_s: float = 0.0

    def merge(self, other: "Clock") -> None:
        self.target_s += other.target_s
        self.draft_s += other.draft_s
        self.total_s += other.total_s


@dataclass
class GreedyResult:
    tokens: list[int]
    margins: list[float]  # top-1 minus top-2 logit at each generated token (how close a tie was)
    seconds: float


@dataclass
class SpecResult:
    tokens: list[int]
    counter: AcceptanceCounter
    clock: Clock = field(default_factory=Clock)


def _finish(tokens: list[int], max_new_tokens: int, eos_ids: Collection[int]) -> list[int]:
    tokens = tokens[:max_new_tokens]
    for i, token in enumerate(tokens):
        if token in eos_ids:
            return tokens[: i + 1]
    return tokens


def check_room(target: TargetModel, prompt: Sequence[int], max_new_tokens: int) -> None:
    """Refuse, before the first forward, a prompt whose decode would run past the target's context (the positions
    it was trained on): its file and record are named when the ids came from `prompts.encode`."""
    if target.context is None or len(prompt) + max_new_tokens <= target.context:
        return
    source = getattr(prompt, "prompt", None)
    room = max(0, target.context - len(prompt))
    raise CheckpointError(f"{source.label + ': ' if source else ''}the prompt's {len(prompt):,} tokens and "
                          f"{max_new_tokens:,} new ones exceed the target's {target.context:,}-token context "
                          f"(max_position_embeddings): {room:,} new tokens fit; lower --max-new-tokens or shorten the "
                          "prompt", source.file if source else target.path)


def greedy_decode(target: TargetModel, prompt: Sequence[int], *, max_new_tokens: int,
                  eos_ids: Collection[int] = (), sampler: RejectionSampler | None = None,
                  prefix: SharedPrefix | None = None, progress: Progress | None = None) -> GreedyResult:
    """The target's own continuation, one token per forward with its KV cache: greedy, or drawn by `sampler`. The
    prompt's prefill goes through `prefix` (chunked, and after the rows it shares with the prefix's last run);
    `progress` advances by each token."""
    import torch

    progress = quiet(progress)
    check_room(target, prompt, max_new_tokens)
    start = time.perf_counter()
    tokens: list[int] = []
    margins: list[float] = []
    if max_new_tokens < 1:
        return GreedyResult(tokens, margins, 0.0)
    result = (prefix if prefix is not None else SharedPrefix(target)).run(prompt, ())
    while True:
        top = result.logits[0, -1].float().topk(2)
        token = int(top.indices[0]) if sampler is None else sampler.sample(result.logits[0, -1])
        tokens.append(token)
        margins.append(float(top.values[0] - top.values[1]))
        progress.advance()
        if len(tokens) >= max_new_tokens or token in eos_ids:
            break
        result = target.forward(torch.tensor([[token]], dtype=torch.long), (), result.past, logits_to_keep=1)
    return GreedyResult(tokens, margins, time.perf_counter() - start)


class LiveVerifier:
    """The real target with its KV cache; the prompt's prefill goes through `prefix` (one of the verifier's own
    when none is shared), whose aux ids must include the verifier's."""

    def __init__(self, target: TargetModel, aux_ids: Sequence[int], prefix: SharedPrefix | None = None):
        self.target = target
        self.aux_ids = target.check_aux_ids(aux_ids)
        self.prefix = prefix if prefix is not None else SharedPrefix(target, self.aux_ids)
        self.past = None

    @staticmethod
    def _step(result) -> VerifyStep:
        predictions = result.logits[0].argmax(-1).tolist()
        return VerifyStep(predictions, [a[0] for a in result.aux], result.logits[0])

    def prefill(self, prompt: Sequence[int]) -> VerifyStep:
        result = self.prefix.run(prompt, self.aux_ids)
        self.past = result.past
        return self._step(result)

    def verify(self, tokens: Sequence[int]) -> VerifyStep:
        import torch

        result = self.target.forward(torch.tensor([list(tokens)], dtype=torch.long), self.aux_ids, self.past)
        self.past = result.past
        return self._step(result)

    def commit(self, length: int) -> None:
        self.target.crop(self.past, length)


@dataclass
class Capture:
    """One target pass over prompt + its greedy continuation, with every aux state 0..L."""

    prompt_len: int
    tokens: list[int]  # prompt followed by the continuation
    states: dict[int, Any]  # id -> [S, T]


def capture_pass(target: TargetModel, prompt: Sequence[int], continuation: Sequence[int],
                 aux_ids: Sequence[int] | None = None, *, prefix: SharedPrefix | None = None) -> Capture:
    """Run the target once over prompt + continuation, keeping aux states (all of 0..L by default); through
    `prefix`, after the rows it shares with the prefix's last run (the prompt's, when that was its greedy decode)."""
    tokens = list(prompt) + list(continuation)
    ids = tuple(range(target.num_layers + 1)) if aux_ids is None else target.check_aux_ids(aux_ids)
    result = (prefix if prefix is not None else SharedPrefix(target, ids)).run(tokens, ids)
    return Capture(len(prompt), tokens, {i: a[0] for i, a in zip(ids, result.aux)})


class ReplayVerifier:
    """Answers verify rounds from a `Capture` of the target's greedy decode instead of running the target.

    Along the greedy path the target's prediction after position p is simply the captured token p+1, and
    the loop only ever reads predictions and aux rows up to the first rejected draft, which lie on that
    path. Beyond the end of the capture the prediction is -1 (matches no draft).
    """

    def __init__(self, capture: Capture, aux_ids: Sequence[int]):
        missing = sorted(set(aux_ids) - set(capture.states))
        if missing:
            raise ValueError(f"aux ids {missing} were not captured")
        self.capture = capture
        self.aux_ids = tuple(sorted(set(aux_ids)))
        self.committed = 0

    def _rows(self, start: int, count: int) -> VerifyStep:
        tokens = self.capture.tokens
        predictions = [tokens[p + 1] if p + 1 < len(tokens) else -1 for p in range(start, start + count)]
        return VerifyStep(predictions, [self.capture.states[i][start : start + count] for i in self.aux_ids])

    def prefill(self, prompt: Sequence[int]) -> VerifyStep:
        n = self.capture.prompt_len
        if list(prompt) != self.capture.tokens[:n]:
            raise ValueError("replayed prompt differs from the captured one")
        self.committed = n
        step = self._rows(0, n)
        return VerifyStep(step.predictions[-1:], step.aux)

    def verify(self, tokens: Sequence[int]) -> VerifyStep:
        return self._rows(self.committed, len(tokens))

    def commit(self, length: int) -> None:
        self.committed = length


def speculative_decode(verifier: Verifier, proposer: Proposer, prompt: Sequence[int], *, k: int,
                       max_new_tokens: int, eos_ids: Collection[int] = (),
                       sampler: RejectionSampler | None = None, progress: Progress | None = None) -> SpecResult:
    """Speculative decoding: draft k, verify k+1 rows at once; greedy keeps the longest matching prefix + the
    target's next token, a `sampler` accepts and emits as vLLM's rejection sampler does (it needs the verifier's
    logits: a live target). `progress` advances by the tokens each round emits."""
    progress = quiet(progress)
    clock = Clock()
    counter = AcceptanceCounter(k)
    start = time.perf_counter()

    mark = time.perf_counter()
    step = verifier.prefill(prompt)
    clock.target_s += time.perf_counter() - mark
    if sampler is not None and step.logits is None:
        raise ValueError("this verifier keeps no logits to sample from: replay a sampled continuation greedily")
    out = [step.predictions[-1] if sampler is None else sampler.sample(step.logits[-1])]
    committed = len(prompt)  # positions held by the target's cache; out[-1] is not among them yet
    mark = time.perf_counter()
    proposer.begin(prompt, step.aux, out[0])
    clock.draft_s += time.perf_counter() - mark

    while len(out) < max_new_tokens and out[-1] not in eos_ids:
        mark = time.perf_counter()
        drafts = proposer.propose(k)
        clock.draft_s += time.perf_counter() - mark

        mark = time.perf_counter()
        step = verifier.verify([out[-1], *drafts])
        if sampler is None:
            accepted = 0
            while accepted < k and drafts[accepted] == step.predictions[accepted]:
                accepted += 1
            bonus = step.predictions[accepted]
        else:
            accepted, bonus = sampler.judge(drafts, step.logits)
        committed += accepted + 1
        verifier.commit(committed)
        clock.target_s += time.perf_counter() - mark

        counter.record(accepted)
        out.extend(drafts[:accepted])
        out.append(bonus)
        progress.advance(accepted + 1)
        if len(out) >= max_new_tokens or any(t in eos_ids for t in out[-accepted - 1 :]):
            break
        mark = time.perf_counter()
        proposer.advance(drafts[:accepted], bonus, [a[: accepted + 1] for a in step.aux])
        clock.draft_s += time.perf_counter() - mark

    clock.total_s = time.perf_counter() - start
    return SpecResult(_finish(out, max_new_tokens, eos_ids), counter, clock)


class OracleProposer:
    """Drafts the target's own greedy continuation (given in advance): every draft is accepted."""

    aux_ids: tuple[int, ...] = ()

    def __init__(self, reference: Sequence[int]):
        self.reference = list(reference)
        self.position = 0

    def begin(self, prompt, aux, next_token) -> None:
        self.position = 1

    def propose(self, k: int) -> list[int]:
        drafts = self.reference[self.position : self.position + k]
        return drafts + [0] * (k - len(drafts))  # past the reference: a token the test did not foresee

    def advance(self, accepted, bonus, aux) -> None:
        self.position += len(accepted) + 1


class RandomProposer:
    """Uniformly random drafts: the floor τ ≈ 1."""

    aux_ids: tuple[int, ...] = ()

    def __init__(self, vocab_size: int, seed: int = 0):
        self.vocab_size = vocab_size
        self.rng = random.Random(seed)

    def begin(self, prompt, aux, next_token) -> None:
        pass

    def propose(self, k: int) -> list[int]:
        return [self.rng.randrange(self.vocab_size) for _ in range(k)]

    def advance(self, accepted, bonus, aux) -> None:
        pass
