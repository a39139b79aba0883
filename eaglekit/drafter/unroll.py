"""Training-time-test unrolling: a chain of draft steps over every row of a sequence at once.

Row i of step j stands for the j-th draft of a round whose last committed token is i+1: it sits at position
i+j, reads step j-1's fed-back state at the same row, and attends to the real prefix (step-0 rows <= i) plus
its own earlier steps, exactly what a chain draft sees at inference. EAGLE-3 trains this way; verify's
diagnosis scores teacher-forced chains with it.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch

from eaglekit.drafter.model import Drafter, DraftOutput


def unroll_mask(batch: int, rows: int, step: int, first_row: int = 0) -> torch.Tensor:
    """Additive mask [B, 1, Q, K] for `step`: Q = rows (step 0) or rows - first_row (later steps, which only
    run the rows from `first_row` on); keys = the step-0 rows, causally, then each earlier later-step block
    only on the query's own row."""
    chained = rows - first_row
    queries = rows if step == 0 else chained
    r = torch.arange(queries)[:, None] + (0 if step == 0 else first_row)  # the query's row index
    c = torch.arange(rows + step * chained)[None, :]
    later = c >= rows
    visible = torch.where(later, (c - rows) % max(chained, 1) + first_row == r, c <= r)
    mask = torch.zeros(visible.shape).masked_fill(~visible, float("-inf"))
    return mask[None, None].expand(batch, 1, queries, -1)


def unrolled_steps(drafter: Drafter, input_ids: torch.Tensor, hidden: torch.Tensor, depth: int, *,
                   first_row: int = 0) -> Iterator[DraftOutput]:
    """Yield the outputs of steps 0..depth-1.

    `hidden` [B, S, H] is the combined target state of rows 0..S-1; `input_ids` [B, S + depth - 1] holds the
    token after each row, so step j reads `input_ids[:, j : j + S]` (teacher forcing: the tokens the chain
    would hold had every earlier draft been accepted). Step 0 covers all S rows; later steps only rows
    `first_row`.. (a prompt's rows matter only as keys), so their outputs have S - first_row rows."""
    batch, rows = hidden.shape[:2]
    chained = rows - first_row
    device = hidden.device
    cache = drafter.new_cache(batch, rows + (depth - 1) * chained)
    positions = torch.arange(rows, device=device).expand(batch, rows)
    out = drafter(input_ids[:, :rows], hidden, positions, cache, attn_bias=unroll_mask(batch, rows, 0).to(device))
    yield out
    hidden, positions = out.feedback[:, first_row:], positions[:, first_row:]
    for step in range(1, depth):
        start = first_row + step
        out = drafter(input_ids[:, start : start + chained], hidden, positions + step, cache,
                      attn_bias=unroll_mask(batch, rows, step, first_row).to(device))
        yield out
        hidden = out.feedback
