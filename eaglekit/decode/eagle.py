"""The EAGLE-3 / 3.1 drafter as a proposer, stepping exactly as vLLM's chain proposer does.

Rows pair the target state of position i with the token of position i+1, at position i (reference §9.2).
A round drafts k tokens: the first from the last verified row, the others by feeding the drafter's own
output state back one position further on. After verification the draft cache drops the chain's rows
and the verified rows are run again with the target's real states.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from eaglekit.decode.metrics import DriftStats
from eaglekit.decode.prefix import PREFILL_CHUNK, check_chunk, chunk_spans


class DraftStart:
    """A drafter's pass over one prompt, kept for the next proposer that starts the same prompt: compare replays a
    drafter at several k on one target capture, and the prompt's rows, most of a long context's replay, are the same
    for every k. Share one only between proposers of the same drafter on the same target states."""

    def __init__(self) -> None:
        self.key: tuple | None = None
        self.state: tuple[Any, Any, int] | None = None  # the cache, the last row's outputs, the committed length


class EagleProposer:
    """Greedy chain drafting with a `Drafter`; records drift (hidden-state RMS, sink attention) per depth."""

    def __init__(self, drafter, aux_ids: Sequence[int], *, max_len: int, aux_order: Sequence[int] | None = None,
                 drift: DriftStats | None = None, chunk: int | None = PREFILL_CHUNK, start: DraftStart | None = None):
        """`aux_order` concatenates the (ascending) target states in another order: a hypothesis about
        checkpoints whose fc columns follow an unsorted id list. `max_len` sizes the draft cache; the prompt's
        rows run in pieces as the target's prefill does (`chunk`, eaglekit.decode.prefix). `start` hands the
        prompt's pass to, or takes it from, other proposers of this drafter on the same target states."""
        check_chunk(chunk)
        self.chunk = chunk
        self.drafter = drafter
        self.aux_ids = tuple(sorted(set(aux_ids)))
        self.order = tuple(aux_order) if aux_order is not None else None
        self.max_len = max_len
        self.drift = drift
        self.device = drafter.norm.weight.device
        self._to_target = drafter.target_token_ids().tolist() if drafter.d2t is not None else None
        self.start = start
        self.cache: Any = None  # the drafter's KV cache, made by begin()
        self.committed = 0
        self._last: tuple[Any, Any, Any, Any] | None = None  # draft logits, feedback, hidden fed in, sink

    def _combine(self, aux: list[Any]):
        rows = [aux[i] for i in self.order] if self.order is not None else aux
        return self.drafter.combine([r.unsqueeze(0).to(self.device) for r in rows])

    def _token(self, draft_logits) -> int:
        index = int(draft_logits.argmax())
        return self._to_target[index] if self._to_target is not None else index

    def _run(self, tokens: Sequence[int], hidden, start: int, sink: bool):
        import torch

        ids = torch.tensor([list(tokens)], dtype=torch.long, device=self.device)
        with torch.inference_mode():
            out = self.drafter(ids, hidden, self._positions(start, len(tokens)), self.cache,
                               return_sink_attention=sink, last_row_only=True)
        sink_last = out.sink_attention[0, -1] if out.sink_attention is not None else None
        return out.draft_logits[0, -1], out.feedback[0, -1], hidden[0, -1], sink_last

    def _positions(self, start: int, rows: int):
        import torch

        return torch.arange(start, start + rows, device=self.device).unsqueeze(0)

    def begin(self, prompt: Sequence[int], aux: list[Any], next_token: int) -> None:
        import torch

        key = (tuple(prompt), next_token, self.aux_ids, self.order)
        if self.start is not None and self.start.key == key and self.start.state is not None:
            cache, self._last, self.committed = self.start.state
            self.cache = cache.copy(self.max_len)
            return
        self.cache = self.drafter.new_cache(1, self.max_len)
        with torch.inference_mode():
            hidden = self._combine(aux)
        rows = [*prompt[1:], next_token]
        *pieces, (first, last) = chunk_spans(0, len(rows), self.chunk)
        for start, end in pieces:  # only their keys and values: no draft reads these pieces' outputs
            ids = torch.tensor([rows[start:end]], dtype=torch.long, device=self.device)
            with torch.inference_mode():
                self.drafter.extend_cache(ids, hidden[:, start:end], self._positions(start, end - start), self.cache)
        # no sink statistics on the prompt pass: they would cost a full attention matrix over a long prompt
        self._last = self._run(rows[first:last], hidden[:, first:last], first, sink=False)
        self.committed = len(prompt)
        if self.start is not None:
            self.start.key, self.start.state = key, (self.cache.copy(), self._last, self.committed)

    def propose(self, k: int) -> list[int]:
        if self._last is None:
            raise RuntimeError("propose() before begin()")
        logits, feedback, fed, sink = self._last
        self._record(1, fed, sink)
        drafts = [self._token(logits)]
        position = self.committed - 1
        for depth in range(2, k + 1):
            position += 1
            logits, next_feedback, fed, sink = self._run([drafts[-1]], feedback.view(1, 1, -1), position,
                                                         sink=self.drift is not None)
            self._record(depth, fed, sink)
            feedback = next_feedback
            drafts.append(self._token(logits))
        return drafts

    def advance(self, accepted: Sequence[int], bonus: int, aux: list[Any]) -> None:
        import torch

        self.cache.truncate(self.committed)
        with torch.inference_mode():
            hidden = self._combine(aux)
        self._last = self._run([*accepted, bonus], hidden, self.committed, sink=self.drift is not None)
        self.committed += len(accepted) + 1

    def _record(self, depth: int, fed, sink) -> None:
        if self.drift is None:
            return
        rms = float(fed.float().pow(2).mean().sqrt())
        self.drift.record(depth, rms, float(sink) if sink is not None else None)
