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
    token of `token_ids`. `scale` is set when the states come quantized (hs-connectors' FP8 files): every state is
    then float8 E4M3, its value the E4M3 value times its token's `scale` (float32 [T], shared by every id).
    """

    index: int
    token_ids: tuple[int, ...]
    states: dict[int, "torch.Tensor"]
    scale: "torch.Tensor | None" = None

    def float_state(self, layer_id: int) -> "torch.Tensor":
        """The state of `layer_id` as float32 (E4M3 values times their token's scale, in float32)."""
        import torch

        state = self.states[layer_id].to(torch.float32)
        return state if self.scale is None else state * self.scale[:, None]
