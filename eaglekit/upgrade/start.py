"""The function-preserving EAGLE-3.1 start: norm_output switched on without losing the EAGLE-3 function.

With norm_output every step after the first is fed norm(h)·w instead of the pre-norm state h, whose RMS is
~40 in a trained EAGLE-3 draft. The next step reads its hidden input through the scale-invariant hidden_norm
but adds it to the residual stream as is, so a fraction of the residual reaches the layer and the chain falls
apart (vLLM measured τ 1.835 → 1.602 on the bundled drafter). Setting the final norm's weight to the
constant c = mean RMS of h and folding the old weight into lm_head (lm_head·diag(w/c)) keeps every logit and
feeds h·c/rms(h): the EAGLE-3 state up to its per-token magnitude spread. No weight can do better for every
token at once (the per-token rms is not a weight), so the rest is measured: on held-out calibration tokens,
the fed-back state's error and the drafts' top-1 agreement with the source function at each depth
(teacher-forced chains, the same inputs for both).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any, cast

import numpy as np

from eaglekit.capture.sequence import CalibrationRecords, CapturedSequence
from eaglekit.upgrade.encode import round_to

AGREEMENT_DEPTH = 3  # chained draft steps the agreement is measured at


@dataclass(frozen=True)
class StartFidelity:
    """How closely the EAGLE-3.1 start computes what its EAGLE-3 source computes, on held-out tokens."""

    tokens: int  # held-out positions measured
    scale: float  # c: the final norm weight, the mean pre-norm RMS on the fit tokens
    feedback_relative_error: float  # mean |c/rms(h) − 1|: the fed-back state against the EAGLE-3 one
    feedback_worst: float  # the 99th percentile of that error
    agreement: list[float]  # top-1 agreement with the source per depth (step 1 = fc_norm and head rounding)
    agreement_without_rescale: list[float]  # the same with norm_output switched on plainly (the old warm start)

    def to_dict(self) -> dict[str, Any]:
        return {k: (round(v, 6) if isinstance(v, float) else [round(x, 6) for x in v] if isinstance(v, list) else v)
                for k, v in asdict(self).items()}


def _rows(seq: CapturedSequence, depth: int):
    """(input ids [1, S-1], aux [1, S-1-depth+1, K*T]) of one captured sequence for a teacher-forced chain `depth` deep:
    row i holds the state of position i, paired with token i+1."""
    rows = len(seq.token_ids) - depth
    return seq.tokens[1:][None], seq.joined()[:rows][None]


def prenorm_rms(drafter, sequences: Sequence[CapturedSequence]) -> np.ndarray:
    """Per position, the RMS of the first step's pre-norm state h (position 0, the attention sink, left out)."""
    import torch

    from eaglekit.drafter.unroll import unrolled_steps

    config = drafter.config
    drafter.config = config.with_overrides({"norm_output": False})
    try:
        with torch.no_grad():
            out = []
            for seq in sequences:
                if len(seq.token_ids) < 3:
                    continue
                ids, aux = _rows(seq, 1)
                weight = drafter.norm.weight
                h = next(unrolled_steps(drafter, ids.to(weight.device), drafter.combine(aux.to(weight)), 1)).feedback
                out.append(h[0, 1:].float().pow(2).mean(-1).sqrt().cpu().numpy())
    finally:
        drafter.config = config
    return np.concatenate(out) if out else np.zeros(0)


def fold_scale(norm_weight: np.ndarray, scale: float) -> np.ndarray:
    """The per-column factor lm_head takes when the final norm weight becomes the constant `scale`."""
    return norm_weight.astype(np.float32) / np.float32(scale)


def top1_chains(drafter, sequences: Sequence[CapturedSequence], depth: int = AGREEMENT_DEPTH) -> list[np.ndarray]:
    """Per depth, the draft's top-1 (draft vocabulary) at every chained row, teacher forced."""
    import torch

    from eaglekit.drafter.unroll import unrolled_steps

    per_depth: list[list[np.ndarray]] = [[] for _ in range(depth)]
    with torch.no_grad():
        for seq in sequences:
            if len(seq.token_ids) <= depth + 1:
                continue
            ids, aux = _rows(seq, depth)
            weight = drafter.norm.weight
            for j, out in enumerate(unrolled_steps(drafter, ids.to(weight.device), drafter.combine(aux.to(weight)),
                                                   depth, first_row=1)):
                logits = out.draft_logits[0, 1:] if j == 0 else out.draft_logits[0]  # row 0: the sink
                per_depth[j].append(logits.argmax(-1).cpu().numpy())
    return [np.concatenate(p) if p else np.zeros(0, dtype=np.int64) for p in per_depth]


def agreement(a: list[np.ndarray], b: list[np.ndarray]) -> list[float]:
    return [float(np.mean(x == y)) if len(x) else float("nan") for x, y in zip(a, b)]


@dataclass(frozen=True)
class Start:
    """What the writer needs: the final norm's new weight and lm_head's column factor, and how close it is."""

    norm_weight: np.ndarray  # [H] float32, every entry c rounded to the norm's output dtype
    column_scale: np.ndarray  # [H] float32: lm_head · diag(column_scale)
    fidelity: StartFidelity


def function_preserving_start(spec, capture: CalibrationRecords, *, fc_norm_weights: np.ndarray | None,
                              fc_norm_dtype: str, norm_dtype: str, head_dtype: str) -> Start:
    """Fit c on the capture's fit part and measure the start on its held-out part.

    `fc_norm_weights` [K, T] are the added fc_norm's (None when the source has no fc_norm to add). The drafter
    runs in float32; the tensors the upgrade writes are rounded to their output dtypes before they are measured,
    so the figures describe the files, not an ideal."""
    import torch

    from eaglekit.drafter.attention import RmsNormWeight
    from eaglekit.drafter.model import Drafter

    embed = None if spec.has_embed_tokens else capture.embed_tokens
    source = Drafter.from_spec(spec, embed_tokens=embed)
    reference = top1_chains(source, capture.held_out)
    del source

    start = Drafter.from_spec(spec, embed_tokens=embed,
                              overrides={"fc_norm": fc_norm_weights is not None or spec.flags.fc_norm,
                                         "norm_output": False})
    with torch.no_grad():
        if fc_norm_weights is not None:
            assert start.fc_norm is not None, "the fc_norm override builds it"
            rounded = round_to(fc_norm_weights.astype(np.float32), fc_norm_dtype)
            for k, norm in enumerate(start.fc_norm):
                cast(RmsNormWeight, norm).weight.copy_(torch.from_numpy(rounded[k]))
        fit_rms = prenorm_rms(start, capture.fit)
        held_rms = prenorm_rms(start, capture.held_out)
        scale = float(round_to(np.array([fit_rms.mean()], dtype=np.float32), norm_dtype)[0])
        ratio_error = np.abs(scale / np.maximum(held_rms, 1e-30) - 1.0)

        start.config = start.config.with_overrides({"norm_output": True})
        plain = top1_chains(start, capture.held_out)
        old = start.norm.weight.detach().float().numpy()
        column_scale = fold_scale(old, scale)
        head = start.head_weight.detach().float().numpy() * column_scale[None, :]
        start.head_weight.copy_(torch.from_numpy(round_to(head, head_dtype)))
        norm_weight = np.full_like(old, scale)
        start.norm.weight.copy_(torch.from_numpy(norm_weight))
        rescaled = top1_chains(start, capture.held_out)

    fidelity = StartFidelity(
        tokens=int(len(held_rms)), scale=scale, feedback_relative_error=float(ratio_error.mean()),
        feedback_worst=float(np.quantile(ratio_error, 0.99)) if len(ratio_error) else float("nan"),
        agreement=agreement(reference, rescaled), agreement_without_rescale=agreement(reference, plain))
    return Start(norm_weight, column_scale, fidelity)
