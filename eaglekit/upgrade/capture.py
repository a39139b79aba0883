"""Run the target on calibration text and fit the added fc_norm weights from its aux hidden states.

The first three quarters of the tokens feed the least-squares statistics; the last quarter is held out to
measure fidelity. Position 0 of every sequence is skipped: that token's hidden state is an attention sink with
outsized activations which would dominate the fit, and drafting proposes from later positions.
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib import resources

import numpy as np

from eaglekit.errors import CheckpointError, UsageError
from eaglekit.upgrade.calibrate import FcNormFit, Fidelity, fc_fidelity

SEQUENCE_LENGTH = 256
HELD_OUT_FRACTION = 0.25


@dataclass(frozen=True)
class Calibration:
    weights: np.ndarray  # [K, T] float64
    fit_tokens: int
    calibrated: Fidelity  # on held-out tokens
    ones: Fidelity  # the same tokens with unit fc_norm weights, for comparison
    text_source: str


def calibration_text(path: str | None) -> tuple[str, str]:
    """(text, where it came from): a user file, or the bundled prose-and-code sample."""
    if path is None:
        return resources.files("eaglekit.data").joinpath("calibration.txt").read_text(encoding="utf-8"), "bundled"
    try:
        with open(path, encoding="utf-8") as fh:
            return fh.read(), path
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"cannot read the calibration file ({exc})".splitlines()[0], path) from None


def _sequences(ids: list[int]) -> list[list[int]]:
    chunks = (ids[i:i + SEQUENCE_LENGTH] for i in range(0, len(ids), SEQUENCE_LENGTH))
    return [c for c in chunks if len(c) > 1]


def calibrate_fc_norm(target_dir: str, aux_ids: tuple[int, ...], fc_weight: np.ndarray, *, eps: float, dtype: str,
                      text_file: str | None = None, max_tokens: int = 2048, device: str = "cpu") -> Calibration:
    """Fit fc_norm weights for `aux_ids` (vLLM convention, ascending) and measure them through `fc_weight`."""
    import torch

    from eaglekit.target_model import load_target

    text, where = calibration_text(text_file)
    target = load_target(target_dir, device=device, dtype="auto")
    if target.tokenizer is None:
        raise CheckpointError("the target has no tokenizer; calibration needs one to read the text", target_dir)
    ids = list(target.tokenizer(text, add_special_tokens=True)["input_ids"])[:max_tokens]
    held = max(SEQUENCE_LENGTH // 4, int(len(ids) * HELD_OUT_FRACTION))
    if len(ids) - held < 64:
        raise UsageError(f"calibration text is too short: {len(ids)} tokens (need at least {64 + held})", where)
    fit_ids, test_ids = ids[:-held], ids[-held:]

    width = int(fc_weight.shape[1]) // len(aux_ids)
    fit = FcNormFit(len(aux_ids), width, eps, dtype)
    test: list[list[np.ndarray]] = [[] for _ in aux_ids]
    for part, sink in ((fit_ids, None), (test_ids, test)):
        for seq in _sequences(part):
            out = target.forward(torch.tensor([seq], dtype=torch.long), aux_ids, logits_to_keep=1)
            chunks = [a[0, 1:].float().cpu().numpy() for a in out.aux]
            if sink is None:
                fit.update(chunks)
            else:
                for k, c in enumerate(chunks):
                    sink[k].append(c)
    weights = fit.weights()
    held_chunks = [np.concatenate(parts) for parts in test]
    return Calibration(
        weights=weights,
        fit_tokens=fit.tokens,
        calibrated=fc_fidelity(fc_weight, held_chunks, weights, eps, dtype),
        ones=fc_fidelity(fc_weight, held_chunks, np.ones_like(weights), eps, dtype),
        text_source=where,
    )
