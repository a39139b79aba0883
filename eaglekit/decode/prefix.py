"""The target's KV cache over a prompt, computed in chunks and kept for the next pass that starts with the same
tokens.

A measurement at long context runs the target over one prompt several times: its own greedy decode, then the
pass every draft is measured on (compare's capture, verify's live decode), and the same prompt under a longer
--context-tokens condition. Each would pay the prefill of the whole prompt again; `SharedPrefix` keeps the KV
cache and the aux states of the last pass and starts the next one after the rows it shares with it.

A prefill runs in pieces that end at multiples of `chunk` positions, so attention never spans more than that many
queries at once and the activations held are one piece's, not the whole prompt's. Every row before a multiple of
`chunk` is thus computed by the same forwards whichever pass computed it, from the same earlier rows: a pass that
takes them from an earlier one decodes exactly what it would have decoded alone. A run shorter than two chunks is
one forward, as every short prompt always ran. This module does not import torch.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from eaglekit.errors import UsageError
from eaglekit.target_model import TargetPass

PREFILL_CHUNK = 512
"""Rows per prefill piece: SmolLM2's 8k context in 16 pieces; a pass over fewer than 1024 tokens is one forward."""


def check_chunk(chunk: int | None) -> None:
    if chunk is not None and (isinstance(chunk, bool) or not isinstance(chunk, int) or chunk < 1):
        raise UsageError(f"prefill chunk {chunk!r}: expected a whole number of tokens, at least 1 (None: one forward)")


def chunk_spans(start: int, end: int, chunk: int | None) -> list[tuple[int, int]]:
    """The pieces [first, last) of positions start..end: cut at every multiple of `chunk` between them, except in a
    run that ends before two chunks (one forward, as every short prompt always ran); one piece without a chunk."""
    if chunk is None or end < 2 * chunk:
        return [(start, end)]
    edges = [start, *range((start // chunk + 1) * chunk, end, chunk), end]
    return list(zip(edges, edges[1:]))


def _common_length(a: Sequence[int], b: Sequence[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def _windowed(past) -> bool:
    """A cache with a sliding-window layer keeps only its window's rows: it cannot be rolled back to an earlier
    prefix, so nothing is taken from it."""
    return any(getattr(layer, "is_sliding", False) for layer in getattr(past, "layers", ()))


class SharedPrefix:
    """One target's KV cache and aux states over the last prompt it ran, reused by the next run that shares its
    leading tokens. Passes run one after another: a run hands out the cache itself, which the caller extends
    (decode steps, verify rounds) and crops no shorter than that run's tokens."""

    def __init__(self, target, aux_ids: Sequence[int] = (), chunk: int | None = PREFILL_CHUNK):
        check_chunk(chunk)
        self.target = target
        self.aux_ids = target.check_aux_ids(aux_ids)
        self.chunk = chunk
        self.reused_rows = 0  # rows taken from earlier runs, over every run (what the sharing saved)
        self.computed_rows = 0  # rows the target computed in runs
        self._tokens: list[int] = []  # the last run's tokens
        self._settled = 0  # its leading rows computed by whole chunks: what a later run may keep
        self._past: Any = None
        self._aux: list[Any] = []  # [1, rows, T] per aux id (ascending) over the last run's tokens

    def reusable(self, ids: Sequence[int]) -> int:
        """Rows of `ids` a run would take from the last one: a multiple of the chunk the two share, that the last
        run settled, and that a pass over `ids` alone would end a piece at (short of its last row)."""
        if self.chunk is None or self._past is None or len(ids) < 2 * self.chunk or _windowed(self._past):
            return 0
        limit = min(self._settled, len(ids) - 1, self.target.cache_length(self._past))
        limit = min(limit, _common_length(self._tokens[:limit], ids))
        return limit // self.chunk * self.chunk

    def run(self, ids: Sequence[int], aux_ids: Sequence[int] | None = None) -> TargetPass:
        """A TargetPass over `ids` from position 0: the logits of the last row, the aux states of every row (for
        `aux_ids`, a subset of this prefix's; all of them by default) and the cache holding them."""
        import torch

        ids = list(ids)
        if not ids:
            raise ValueError("a prefill needs at least one token")
        wanted = self.aux_ids if aux_ids is None else self.target.check_aux_ids(aux_ids)
        missing = sorted(set(wanted) - set(self.aux_ids))
        if missing:
            raise ValueError(f"aux ids {missing} are not kept by this prefix (it keeps {list(self.aux_ids)})")
        keep = self.reusable(ids)
        past, held = self._past, self._aux
        self._tokens, self._settled, self._past, self._aux = [], 0, None, []  # the rows not kept are freed as it runs
        if keep:
            self.target.crop(past, keep)
        else:
            past, held = self.target.new_cache(), []
        parts: list[list[Any]] = [[a[:, :keep] for a in held]] if keep else []
        del held
        result = None
        for first, last in chunk_spans(keep, len(ids), self.chunk):
            result = self.target.forward(torch.tensor([ids[first:last]], dtype=torch.long), self.aux_ids, past,
                                         logits_to_keep=1)
            parts.append(result.aux)
        assert result is not None, "at least one piece runs"
        aux = [torch.cat(pieces, dim=1) if len(pieces) > 1 else pieces[0] for pieces in zip(*parts)]
        self.reused_rows += keep
        self.computed_rows += len(ids) - keep
        self._tokens, self._past, self._aux = ids, past, aux
        self._settled = chunk_spans(keep, len(ids), self.chunk)[-1][0] if self.chunk is not None else 0
        by_id = dict(zip(self.aux_ids, aux))
        return TargetPass(result.logits, [by_id[i] for i in wanted], past)
