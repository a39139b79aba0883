"""What a training step is fed: batches of similar-length sequences, their input ids, draft-vocabulary labels and
aux states (training and the held-out replay share them)."""

from __future__ import annotations

import random
from collections.abc import Iterator, Sequence

import torch

from eaglekit.drafter.model import Drafter

IGNORE = -100


def batch_groups(offsets: torch.Tensor, batch_tokens: int, rng: random.Random,
                 windows: Sequence[int] | None = None) -> Iterator[list[int]]:
    """Endless global batches of similar-length sequences, about `batch_tokens` rows each, reshuffled per epoch.

    `windows` (one number per sequence) keeps every batch inside one window, and an epoch visits the windows one
    after another in a shuffled order: data streamed from disk keeps only one window's shards in memory. With a
    single window the batches are the in-memory ones."""
    lengths = (offsets[1:] - offsets[:-1]).tolist()
    parts = sorted(set(windows)) if windows is not None else [0]
    members = {w: [i for i in range(len(lengths)) if windows is None or windows[i] == w] for w in parts}
    grouped: dict[int, list[list[int]]] = {}
    for w, indices in members.items():
        order = sorted(indices, key=lambda i: lengths[i])
        groups, start = [], 0
        while start < len(order):
            width = lengths[order[min(len(order) - 1, start)]]
            size = max(1, batch_tokens // max(width, 1))
            groups.append(order[start : start + size])
            start += size
        grouped[w] = groups
    while True:
        if len(parts) > 1:
            rng.shuffle(parts)
        for w in parts:
            rng.shuffle(grouped[w])
            yield from grouped[w]


def make_batch(data, seqs: Sequence[int], depth: int, to_draft: torch.Tensor):
    """(input ids [B, W+depth], draft-vocab labels [B, W+depth], aux [B, W, K*T] fp32, W), right-padded."""
    offsets, tokens, labels, aux = data.offsets, data.tokens, data.labels, data.aux
    lens = [int(offsets[i + 1] - offsets[i]) for i in seqs]
    width = max(lens)
    ids = torch.zeros((len(seqs), width + depth), dtype=torch.long)
    lab = torch.full((len(seqs), width + depth), IGNORE, dtype=torch.long)
    hid = torch.zeros((len(seqs), width, aux.shape[1]), dtype=torch.float32)
    for row, (i, n) in enumerate(zip(seqs, lens)):
        lo = int(offsets[i])
        ids[row, :n] = tokens[lo : lo + n]
        target = labels[lo : lo + n]
        lab[row, :n] = torch.where(target >= 0, to_draft[target.clamp_min(0)], IGNORE)
        hid[row, :n] = aux[lo : lo + n].float()
    return ids, lab, hid, width


def soft_batch(data, seqs: Sequence[int], to_draft: torch.Tensor, labels: torch.Tensor):
    """The teacher's top-k next tokens in the draft vocabulary [B, W+depth, k] (IGNORE outside it) and their
    probabilities renormalised over those, laid out as make_batch's `labels`; a row without a label (padding, masked,
    or a greedy token outside the draft vocabulary) has no probability mass, so it counts exactly as in greedy
    training, and with k = 1 the loss is greedy training's cross-entropy."""
    k = data.soft_ids.shape[1]
    ids = torch.full((*labels.shape, k), IGNORE, dtype=torch.long)
    probs = torch.zeros((*labels.shape, k), dtype=torch.float32)
    for row, i in enumerate(seqs):
        lo, hi = int(data.offsets[i]), int(data.offsets[i + 1])
        ids[row, : hi - lo] = torch.where(data.soft_ids[lo:hi] >= 0, to_draft[data.soft_ids[lo:hi]], IGNORE)
        probs[row, : hi - lo] = data.soft_probs[lo:hi]
    probs = torch.where((ids != IGNORE) & (labels != IGNORE)[..., None], probs, torch.zeros_like(probs))
    return ids, probs / probs.sum(-1, keepdim=True).clamp_min(torch.finfo(torch.float32).tiny)


def idle_batch(depth: int, aux_width: int):
    """A one-row batch with no label, read from nowhere: a data-parallel rank none of whose data is in the global
    batch still runs the step (DDP's gradient all-reduce needs every rank) and adds nothing to it."""
    return (torch.zeros((1, 1 + depth), dtype=torch.long), torch.full((1, 1 + depth), IGNORE, dtype=torch.long),
            torch.zeros((1, 1, aux_width), dtype=torch.float32), 1)


def draft_label_map(drafter: Drafter) -> torch.Tensor:
    """Target id -> draft id (IGNORE for tokens outside the draft vocabulary)."""
    to_target = drafter.target_token_ids().cpu()
    to_draft = torch.full((drafter.config.vocab_size,), IGNORE, dtype=torch.long)
    to_draft[to_target] = torch.arange(len(to_target))
    return to_draft


def label_counts(labels: torch.Tensor, depth: int, width: int) -> torch.Tensor:
    """Labelled rows per depth (step j at row i is scored against labels[i + 1 + j])."""
    return torch.stack([(labels[:, 1 + j : 1 + j + width] != IGNORE).sum() for j in range(depth)])
