"""Decode τ replayed on captured data: the score finetune selects its kept step by.

Where a captured sequence is the target's own greedy text (the target's greedy token after each position is the
next token, as in an answer from `--generate`), a chain speculative decode of that text needs no target: the
target's prediction after every committed token is the captured label. Each round starts at a committed token,
drafts k tokens with the drafter's own fed-back states (the training-time test's unrolling, which attends
exactly as a chain draft does at inference), accepts the leading drafts that equal the labels and continues
after the bonus token, as `speculative_decode` does. Teacher forcing is exact here: the tokens a chain reads are
the captured ones only as far as every earlier draft was accepted, which is as far as acceptance is counted.
τ = 1 + accepted / rounds, vLLM's definition, pooled over the held-out sequences.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass

import torch

from eaglekit.drafter.unroll import unrolled_steps


@dataclass(frozen=True)
class ReplayScore:
    acceptance_length: float
    rounds: int


def greedy_runs(tokens: list[int], labels: list[int]) -> list[tuple[int, int]]:
    """Maximal [u, v] with labels[t] == tokens[t + 1] for every t in it: the stretches of the target's own greedy
    text."""
    runs, start = [], None
    for t in range(len(tokens) - 1):
        if labels[t] == tokens[t + 1]:
            start = t if start is None else start
        elif start is not None:
            runs.append((start, t - 1))
            start = None
    if start is not None:
        runs.append((start, len(tokens) - 2))
    return runs


def rounds_accepted(hits: torch.Tensor, runs: list[tuple[int, int]], k: int) -> list[int]:
    """Accepted drafts per round of a chain-k decode over each run. `hits[i, j]`: the draft of depth j from row i
    (a round whose last committed token is i + 1) equals the target's greedy token. A round needs the whole chain
    on greedy text (rows i .. i + k - 1 inside the run); the next round starts after the bonus token."""
    leading = torch.cumprod(hits.long(), dim=1).sum(dim=1).tolist()
    accepted = []
    for u, v in runs:
        row = u
        while row + k - 1 <= v:
            accepted.append(int(leading[row]))
            row += int(leading[row]) + 1
    return accepted


def replay_tau(drafter, data, k: int, batch_tokens: int, to_draft: torch.Tensor, *,
               sequences: Collection[int] | None = None, pool=None) -> ReplayScore | None:
    """Chain-k decode τ of `drafter` replayed on `data`'s greedy stretches (fp32, no gradients); None when the
    data holds no stretch of the target's own greedy text k + 1 tokens long (text without `--generate`).

    `sequences` replays only those sequences and `pool` sums the (accepted, rounds) counts over the processes
    that replayed the rest (torchrun ranks each reading their own shards), so every rank gets the same τ."""
    from eaglekit.finetune.batches import make_batch

    device = drafter.norm.weight.device
    offsets = data.offsets.tolist()
    tokens, labels = data.tokens.tolist(), data.labels.tolist()
    runs = {i: greedy_runs(tokens[offsets[i]:offsets[i + 1]], labels[offsets[i]:offsets[i + 1]])
            for i in range(len(offsets) - 1)}
    runs = {i: [(u, v) for u, v in r if v - u + 1 >= k] for i, r in runs.items()}
    wanted = set(range(len(offsets) - 1)) if sequences is None else set(sequences)
    picked = sorted((i for i, r in runs.items() if r and i in wanted), key=lambda i: offsets[i + 1] - offsets[i])
    accepted: list[int] = []
    was_training = drafter.training
    drafter.eval()
    with torch.no_grad():
        batch: list[int] = []
        rows = 0
        for n, i in enumerate(picked):
            batch, rows = batch + [i], rows + offsets[i + 1] - offsets[i]
            if rows < batch_tokens and n + 1 < len(picked):
                continue
            ids, draft_labels, aux, width = make_batch(data, batch, k, to_draft)
            steps = unrolled_steps(drafter, ids[:, 1:].to(device), drafter.combine(aux.to(device)), k)
            predictions = torch.stack([out.draft_logits.argmax(-1).cpu() for out in steps], dim=-1)  # [B, W, k]
            truth = torch.stack([draft_labels[:, 1 + j: 1 + j + width] for j in range(k)], dim=-1)
            hits = predictions == truth
            for row, seq in enumerate(batch):
                accepted += rounds_accepted(hits[row], runs[seq], k)
            batch, rows = [], 0
    drafter.train(was_training)
    totals = torch.tensor([float(sum(accepted)), float(len(accepted))], dtype=torch.float64)
    if pool is not None:
        totals = pool(totals)
    if not totals[1]:
        return None
    return ReplayScore(1.0 + float(totals[0] / totals[1]), int(totals[1]))
