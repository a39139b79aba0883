"""Least-squares initial weights for added fc_norm layers, and the fidelity they achieve through `fc`.

The target's states on the calibration text come from capture/ (a store of `capture --calibration`, or the
target run in-process into one): its first three quarters of tokens feed the fit, the last quarter is held out to
measure fidelity. Position 0 of every sequence is left out of the fit: that token's hidden state is an attention
sink with outsized activations which would dominate it, and drafting proposes from later positions.

For aux chunk k the runtime computes y = w ⊙ n with n = round(x · rsqrt(mean(x²) + eps)) (reference §9.1).
Choosing w per channel c to minimise Σ_tokens (n_c·w_c − x_c)² gives w_c = Σ n_c·x_c / Σ n_c², so fc(y) stays
as close as a per-channel scale allows to the original fc(x). The sums are accumulated in float64 over the
calibration tokens; the fidelity is measured on held-out tokens through the real `fc` weight.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from eaglekit.capture.sequence import CalibrationRecords, CapturedSequence
from eaglekit.upgrade.encode import round_to


def rms_normalize(x: np.ndarray, eps: float, dtype: str) -> np.ndarray:
    """The unit-weight RMSNorm of each row as the runtime computes it: float32 math, rounded to `dtype`."""
    x32 = x.astype(np.float32)
    scale = 1.0 / np.sqrt(np.mean(x32 * x32, axis=-1, keepdims=True, dtype=np.float32) + np.float32(eps))
    return round_to((x32 * scale).astype(np.float32), dtype)


def apply_fc_norm(chunks: list[np.ndarray], weights: np.ndarray, eps: float, dtype: str) -> list[np.ndarray]:
    """fc_norm.k applied to chunk k: weight multiply in the runtime dtype, after the normalised value is rounded."""
    w = round_to(weights.astype(np.float32), dtype)
    return [round_to(rms_normalize(x, eps, dtype) * w[k], dtype) for k, x in enumerate(chunks)]


class FcNormFit:
    """Sufficient statistics of the per-channel least-squares fit, one row per aux chunk."""

    def __init__(self, num_aux: int, width: int, eps: float, dtype: str):
        self.num = np.zeros((num_aux, width), dtype=np.float64)
        self.den = np.zeros((num_aux, width), dtype=np.float64)
        self.eps = eps
        self.dtype = dtype
        self.tokens = 0

    def update(self, chunks: list[np.ndarray]) -> None:
        """Add tokens: `chunks[k]` is [N, T], the k-th aux state (ascending layer id) as the draft receives it."""
        for k, x in enumerate(chunks):
            x = round_to(x.astype(np.float32), self.dtype)
            n = rms_normalize(x, self.eps, self.dtype).astype(np.float64)
            self.num[k] += np.einsum("nc,nc->c", n, x.astype(np.float64))
            self.den[k] += np.einsum("nc,nc->c", n, n)
        self.tokens += chunks[0].shape[0]

    def weights(self) -> np.ndarray:
        """[K, T] float64; a channel that never fired keeps weight 1."""
        out = np.ones_like(self.num)
        seen = self.den > 0
        out[seen] = self.num[seen] / self.den[seen]
        return out


@dataclass(frozen=True)
class Fidelity:
    """How close fc(fc_norm(x)) stays to the original fc(x) on held-out tokens."""

    tokens: int
    relative_error: float  # ||fc(y) - fc(x)||_F / ||fc(x)||_F
    cosine: float  # mean over tokens of cos(fc(y)_i, fc(x)_i)
    min_cosine: float


def fc_fidelity(fc_weight: np.ndarray, chunks: list[np.ndarray], weights: np.ndarray, eps: float,
                dtype: str) -> Fidelity:
    """Compare the original `fc` output with the one after fc_norm, both from inputs rounded to `dtype`."""
    x = [round_to(c.astype(np.float32), dtype) for c in chunks]
    y = apply_fc_norm(x, weights, eps, dtype)
    w = fc_weight.astype(np.float32)
    a = (np.concatenate(x, axis=-1) @ w.T).astype(np.float64)
    b = (np.concatenate(y, axis=-1) @ w.T).astype(np.float64)
    rel = float(np.linalg.norm(a - b)) / max(float(np.linalg.norm(a)), 1e-30)
    dots = np.einsum("nh,nh->n", a, b)
    norms = np.linalg.norm(a, axis=-1) * np.linalg.norm(b, axis=-1)
    cos = dots / np.maximum(norms, 1e-30)
    return Fidelity(tokens=int(a.shape[0]), relative_error=rel, cosine=float(cos.mean()), min_cosine=float(cos.min()))


@dataclass(frozen=True)
class Calibration:
    weights: np.ndarray  # [K, T] float64
    fit_tokens: int
    calibrated: Fidelity  # on held-out tokens
    ones: Fidelity  # the same tokens with unit fc_norm weights, for comparison
    text_source: str


def aux_chunks(part: Sequence[CapturedSequence]) -> list[np.ndarray]:
    """The K aux states of `part` as K arrays [N, T] (ascending id; position 0 of each sequence left out)."""
    ids = sorted(part[0].states)
    return [np.concatenate([s.float_state(i)[1:].numpy() for s in part]) for i in ids]


def fit_fc_norm(capture: CalibrationRecords, fc_weight: np.ndarray, *, eps: float, dtype: str) -> Calibration:
    """Least-squares fc_norm weights from the fit part, measured through `fc_weight` on the held-out part."""
    fit_chunks = aux_chunks(capture.fit)
    fit = FcNormFit(len(fit_chunks), fit_chunks[0].shape[1], eps, dtype)
    fit.update(fit_chunks)
    weights = fit.weights()
    held = aux_chunks(capture.held_out)
    return Calibration(
        weights=weights,
        fit_tokens=fit.tokens,
        calibrated=fc_fidelity(fc_weight, held, weights, eps, dtype),
        ones=fc_fidelity(fc_weight, held, np.ones_like(weights), eps, dtype),
        text_source=capture.text_source,
    )
