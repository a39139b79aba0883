"""Start training from a function as close to the EAGLE-3 source as EAGLE-3.1 allows.

`upgrade` switches on norm_output: every step after the first is then fed norm(h)·w instead of the pre-norm
state h, whose RMS is ~40 in a trained EAGLE-3 draft. The next step reads its hidden input through the
scale-invariant hidden_norm, but adds it to the residual stream as is, so 1/40 of the residual reaches the
layer and the chain falls apart (vLLM measured τ 1.835 → 1.602). Setting the final norm's weight to the
constant c = mean RMS of h and folding the old weight into lm_head (lm_head·diag(w)/c) keeps every logit
exactly and feeds h·c/rms(h): the EAGLE-3 state up to its per-token magnitude spread (about ±10 %).
fc_norm added with unit weights (an upgrade without the target) gets the least-squares weights upgrade
computes when it has the target, from the captured aux states.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from eaglekit.drafter.unroll import unrolled_steps
from eaglekit.errors import UsageError
from eaglekit.spec import DraftSpec

CALIBRATION_ROWS = 8192
MODES = ("auto", "none")


def upgrade_changes(spec: DraftSpec) -> dict[str, bool]:
    """What the `upgrade` that wrote this draft switched on without training (from its provenance)."""
    block = spec.config.get("eaglekit")
    if not isinstance(block, dict) or block.get("command") != "upgrade":
        return {"norm_output": False, "fc_norm_ones": False}
    conversion = " ".join(str(c) for c in block.get("conversion") or [])
    options = block.get("options") if isinstance(block.get("options"), dict) else {}
    return {"norm_output": "norm_output switched on" in conversion,
            "fc_norm_ones": "fc_norm added" in conversion and options.get("fc_norm_init") == "ones"}


def _sequences(data, limit: int):
    """(aux [1, S, K*T] fp32, next tokens [1, S]) of whole sequences, until `limit` rows are covered."""
    offsets = data.offsets.tolist()
    for lo, hi in zip(offsets, offsets[1:]):
        if lo >= limit:
            return
        if hi - lo > 1:  # the last row has no next token: dropped
            yield data.aux[lo:hi - 1].float()[None], data.tokens[lo + 1:hi][None]


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


def rescale_for_norm_output(drafter, data) -> float | None:
    """Final norm weight := mean RMS of the pre-norm state; the old weight folded into lm_head. Returns c, or
    None when the draft borrows the target's head (nothing to fold into)."""
    if drafter.lm_head is None:
        return None
    with torch.no_grad():
        rms = torch.cat([_prenorm(drafter, tokens, aux).pow(2).mean(-1).sqrt().reshape(-1)
                         for aux, tokens in _sequences(data, CALIBRATION_ROWS)])
        c = float(rms.mean())
        old = drafter.norm.weight.detach().clone()
        drafter.lm_head.weight.mul_((old / c)[None, :])
        drafter.norm.weight.fill_(c)
    return c


def _prenorm(drafter, tokens: torch.Tensor, aux: torch.Tensor) -> torch.Tensor:
    """The first step's pre-norm state h, which the drafter feeds back when norm_output is off."""
    config = drafter.config
    device = drafter.norm.weight.device
    drafter.config = config.with_overrides({"norm_output": False})
    try:
        out = next(unrolled_steps(drafter, tokens.to(device), drafter.combine(aux.to(device)), 1))
    finally:
        drafter.config = config
    return out.feedback.float()


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
        c = rescale_for_norm_output(drafter, data)
        if c is None:
            notes.append("warm start: norm_output not rescaled (the draft borrows the target's lm_head)")
        else:
            notes.append(f"warm start: final norm weight set to the pre-norm RMS {c:.2f} and folded into lm_head, "
                         "so norm_output feeds back the EAGLE-3 state up to its per-token magnitude")
            changed |= {"norm.weight", "lm_head.weight"}
            result.lr_scales.update({"norm.weight": c, "lm_head.weight": 1.0 / c})
    return result
