"""EAGLE-3's training-time test as one loss: each batch unrolled `depth` draft steps (eaglekit.drafter.unroll), step
j fed the drafter's own state of step j-1, the cross-entropy of depth j against the target's greedy token (or its
top-k distribution) over the draft vocabulary weighted `depth_decay**j`; and the same objective, teacher forced
and without gradients, as the held-out score.
"""

from __future__ import annotations

from collections.abc import Collection

import torch
import torch.nn.functional as F
from torch import nn

from eaglekit.drafter.model import Drafter
from eaglekit.drafter.unroll import unrolled_steps
from eaglekit.finetune.batches import IGNORE, label_counts, make_batch


class UnrolledObjective(nn.Module):
    """One forward = the whole unrolled training-time test of a batch (so DDP sees one forward per backward)."""

    def __init__(self, drafter: Drafter, depth: int, depth_decay: float):
        super().__init__()
        self.drafter = drafter
        self.depth = depth
        self.depth_decay = depth_decay

    def forward(self, ids: torch.Tensor, labels: torch.Tensor, aux: torch.Tensor, counts: torch.Tensor,
                soft: tuple[torch.Tensor, torch.Tensor] | None = None):
        """loss (each depth's CE summed over rows / `counts[j]`, weighted) and correct top-1 counts per depth.
        With `soft` (batches.soft_batch) the CE is against the teacher's top-k distribution, not its greedy token."""
        width = aux.shape[1]
        vd = self.drafter.config.draft_vocab_size
        loss = aux.new_zeros((), dtype=torch.float32)
        correct = []
        steps = unrolled_steps(self.drafter, ids[:, 1:], self.drafter.combine(aux), self.depth)
        for j, out in enumerate(steps):
            target = labels[:, 1 + j : 1 + j + width].reshape(-1)
            logits = out.draft_logits.float().reshape(-1, vd)
            if soft is None:
                ce = F.cross_entropy(logits, target, ignore_index=IGNORE, reduction="sum")
            else:
                top, probs = (t[:, 1 + j : 1 + j + width].reshape(-1, t.shape[-1]) for t in soft)
                ce = -(probs * F.log_softmax(logits, dim=-1).gather(1, top.clamp_min(0))).sum()
            loss = loss + ce / counts[j].clamp_min(1) * self.depth_decay**j
            correct.append(((logits.argmax(-1) == target) & (target != IGNORE)).sum())
        return loss, torch.stack(correct)


def validate(drafter: Drafter, data, depth: int, depth_decay: float, batch_tokens: int, to_draft: torch.Tensor,
             autocast, *, sequences: Collection[int] | None = None, pool=None) -> tuple[float, list[float]]:
    """(loss, top-1 per depth) on every held-out sequence, teacher forced, without gradients; the same on every
    rank, so the ranks keep the same weights: each scores the whole held-out part, or only `sequences` (those in
    the shards it owns) with `pool` summing the counts over the ranks."""
    device = drafter.norm.weight.device
    objective = UnrolledObjective(drafter, depth, depth_decay)
    loss, hits, labelled = 0.0, torch.zeros(depth, dtype=torch.float64), torch.zeros(depth, dtype=torch.float64)
    lengths = (data.offsets[1:] - data.offsets[:-1]).tolist()
    window_of = getattr(data.aux, "window_of", None)  # streamed rows: a batch never spans two windows of shards
    windows = window_of(data.offsets[:-1]).tolist() if window_of is not None else [0] * len(lengths)
    scored = range(len(lengths)) if sequences is None else sequences
    order = sorted(scored, key=lambda i: (windows[i], lengths[i]))
    batches: list[list[int]] = []
    batch: list[int] = []
    rows = 0
    for i in order:
        if batch and (rows + lengths[i] > batch_tokens or windows[i] != windows[batch[-1]]):
            batches.append(batch)
            batch, rows = [], 0
        batch, rows = batch + [i], rows + lengths[i]
    batches.append(batch)
    was_training = drafter.training
    drafter.eval()
    with torch.no_grad(), autocast:
        for seqs in filter(None, batches):
            ids, labels, aux, width = make_batch(data, seqs, depth, to_draft)
            counts = label_counts(labels, depth, width).to(device)
            batch_loss, correct = objective(ids.to(device), labels.to(device), aux.to(device), counts)
            share = float(counts[0]) / max(1.0, float(sum(lengths)))
            loss += float(batch_loss) * share
            hits += correct.double().cpu()
            labelled += counts.double().cpu()
    drafter.train(was_training)
    if pool is not None:
        summed = pool(torch.cat([torch.tensor([loss], dtype=torch.float64), hits, labelled]))
        loss, hits, labelled = float(summed[0]), summed[1 : 1 + depth], summed[1 + depth :]
    return loss, [float(v) for v in hits / labelled.clamp_min(1)]
