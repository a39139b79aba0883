"""What capture yields and what its readers return: one sequence's token ids and the target's states at the
requested layer ids (CapturedSequence), and a store's sequences as labelled rows (LabelledStates)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

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

    @property
    def tokens(self) -> "torch.Tensor":
        """The token ids as int64 [T]."""
        import torch

        return torch.tensor(self.token_ids, dtype=torch.long)

    def joined(self, layer_ids: Sequence[int] | None = None) -> "torch.Tensor":
        """float32 [T, K*H]: the states of `layer_ids` (default: every id held, ascending) side by side, as a draft
        reads its K aux states."""
        import torch

        ids = sorted(self.states) if layer_ids is None else list(layer_ids)
        return torch.cat([self.float_state(i) for i in ids], dim=-1)


@dataclass
class LabelledStates:
    """Sequences as rows, concatenated: token ids [N], the target's next token at each row [N] (-100 where none is
    known), the aux states [N, K*H] (a tensor or a store's lazily read rows) and the sequences' boundaries [S+1];
    with soft targets also the target's top-k next tokens [N, k] and their probabilities [N, k]. `digest` names the
    rows' content, `source` says where they came from."""

    tokens: Any
    labels: Any
    aux: Any
    offsets: Any
    digest: str
    source: str
    notes: list[str] = field(default_factory=list)
    soft_ids: Any = None
    soft_probs: Any = None

    @property
    def sequences(self) -> int:
        return int(self.offsets.numel()) - 1

    @property
    def positions(self) -> int:
        return int(self.tokens.numel())


@dataclass(frozen=True)
class CalibrationRecords:
    """upgrade's calibration states read from a store: the records it fits on and those it holds out, where they
    came from, and the target's input embedding [V, H] (float32) for drafts that share it."""

    fit: list[CapturedSequence]
    held_out: list[CapturedSequence]
    text_source: str
    embed_tokens: Any
