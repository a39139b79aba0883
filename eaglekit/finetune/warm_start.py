"""Start training from a function as close to the EAGLE-3 source as EAGLE-3.1 allows.

`upgrade` writes that start itself when it has the target's weights (eaglekit.upgrade.start). A draft an
upgrade left as a plain warm start (no target weights, unit fc_norm, or an older eaglekit) gets the same
set-up here from the captured training data: the norm_output rescale folded into lm_head, and the
least-squares fc_norm weights in place of unit ones.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

import torch

from eaglekit.capture.sequence import CapturedSequence
from eaglekit.errors import UsageError
from eaglekit.provenance import norm_output_scale
from eaglekit.spec import DraftSpec

CALIBRATION_ROWS = 8192
MODES = ("auto", "none")


def upgrade_changes(spec: DraftSpec) -> dict[str, bool]:
    """What the `upgrade` that wrote this draft switched on without training (from its provenance)."""
    block = spec.config.get("eaglekit")
    if not isinstance(block, dict) or block.get("command") != "upgrade":
        return {"norm_output": False, "fc_norm_ones": False}
    conversion = " ".join(str(c) for c in block.get("conversion") or [])
    written_options = block.get("options")
    options = written_options if isinstance(written_options, dict) else {}
    return {"norm_output": "norm_output switched on" in conversion and "norm_output_rescale" not in block,
            "fc_norm_ones": "fc_norm added" in conversion and options.get("fc_norm_init") == "ones"}


def _sequences(data, limit: int, aux_ids: Sequence[int]) -> Iterator[CapturedSequence]:
    """Whole captured sequences (tokens and the aux states of `aux_ids`, ascending) until `limit` rows are
    covered."""
    offsets = data.offsets.tolist()
    ids = sorted(aux_ids)
    for index, (lo, hi) in enumerate(zip(offsets, offsets[1:])):
        if lo >= limit:
            return
        aux = data.aux[lo:hi].float()
        width = aux.shape[1] // len(ids)
        yield CapturedSequence(index, tuple(data.tokens[lo:hi].tolist()),
                               {i: aux[:, k * width:(k + 1) * width] for k, i in enumerate(ids)})


def calibrate_fc_norm(drafter, data, eps: float, dtype: str) -> int:
    """Least-squares fc_norm weights from the captured aux states (eaglekit.upgrade.calibrate's fit)."""
    from eaglekit.upgrade.calibrate import FcNormFit

    k = len(drafter.fc_norm)
    aux = data.aux[:CALIBRATION_ROWS].float().numpy()
    width = aux.shape[1] // k
    fit = FcNormFit(k, width, eps, dtype)
    fit.update([aux[:, i * width:(i + 1) * width] for i in range(k)])
    with torch.no_grad():
        for i, norm in enumerate(drafter.fc_norm):
            norm.weight.copy_(torch.from_numpy(fit.weights()[i]).to(norm.weight))
    return fit.tokens


def rescale_for_norm_output(drafter, data, aux_ids: Sequence[int]) -> float | None:
    """Final norm weight := mean RMS of the pre-norm state; the old weight folded into lm_head. Returns c, or
    None when the draft borrows the target's head (nothing to fold into)."""
    from eaglekit.upgrade.start import fold_scale, prenorm_rms

    if drafter.lm_head is None:
        return None
    with torch.no_grad():
        c = float(prenorm_rms(drafter, list(_sequences(data, CALIBRATION_ROWS, aux_ids))).mean())
        scale = torch.from_numpy(fold_scale(drafter.norm.weight.detach().float().cpu().numpy(), c))
        drafter.lm_head.weight.mul_(scale.to(drafter.lm_head.weight)[None, :])
        drafter.norm.weight.fill_(c)
    return c


@dataclass
class WarmStart:
    notes: list[str] = field(default_factory=list)  # one sentence per change
    changed: set[str] = field(default_factory=set)  # canonical names of the tensors it rewrote
    lr_scales: dict[str, float] = field(default_factory=dict)
    """Learning-rate factors that give a rescaled tensor the relative step size it had before: Adam moves
    every element by about lr, so lm_head divided by c would otherwise move c times faster, the norm
    weight multiplied by c c times slower."""


def apply(drafter, spec: DraftSpec, data, mode: str) -> WarmStart:
    """Apply what `mode` asks (auto: set up what upgrade left untrained)."""
    if mode not in MODES:
        raise UsageError(f"--warm-start {mode!r}: use one of {', '.join(MODES)}")
    result = WarmStart()
    if mode == "none":
        return result
    changes = upgrade_changes(spec)
    notes, changed = result.notes, result.changed
    if changes["fc_norm_ones"] and drafter.fc_norm is not None:
        tokens = calibrate_fc_norm(drafter, data, spec.geometry.rms_norm_eps, spec.dtype)
        notes.append(f"warm start: fc_norm (unit weights from upgrade) fitted by least squares on {tokens} "
                     "captured positions")
        changed |= {f"fc_norm.{i}.weight" for i in range(len(drafter.fc_norm))}
    if changes["norm_output"] and drafter.config.norm_output:
        assert spec.aux.ids is not None, "finetune refuses a draft without aux ids"
        c = rescale_for_norm_output(drafter, data, spec.aux.ids)
        if c is None:
            notes.append("warm start: norm_output not rescaled (the draft borrows the target's lm_head)")
        else:
            notes.append(f"warm start: final norm weight set to the pre-norm RMS {c:.2f} and folded into lm_head, "
                         "so norm_output feeds back the EAGLE-3 state up to its per-token magnitude")
            changed |= {"norm.weight", "lm_head.weight"}
            result.lr_scales.update({"norm.weight": c, "lm_head.weight": 1.0 / c})
    elif drafter.lm_head is not None and (c := norm_output_scale(spec.config)) is not None:
        notes.append(f"the final norm (weight {c:.4g}) and lm_head (divided by it) that upgrade's norm_output "
                     "rescale wrote train at the relative step sizes they had before it")
        result.lr_scales.update({"norm.weight": c, "lm_head.weight": 1.0 / c})
    return result
