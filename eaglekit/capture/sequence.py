"""What a capture backend yields: one sequence's token ids and the target's states at the requested layer ids."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True)
class CapturedSequence:
    """One record of a capture, in the order its token ids were given to the backend.

    `states` maps a layer id in vLLM's convention (the HF `hidden_states` index: id i is the residual stream entering
    decoder layer i, id L the last layer's output before the final norm) to a [T, H] tensor on the CPU, one row per
    token of `token_ids`.
    """

    index: int
    token_ids: tuple[int, ...]
    states: dict[int, "torch.Tensor"]
