"""Run the target once on calibration text and keep what the EAGLE-3.1 start is fitted and measured on.

The first three quarters of the tokens feed the fits (fc_norm least squares, the norm_output rescale); the
last quarter is held out to measure fidelity. Position 0 of every sequence is left out of the fc_norm fit:
that token's hidden state is an attention sink with outsized activations which would dominate it, and
drafting proposes from later positions.
"""

from __future__ import annotations

import codecs
from dataclasses import dataclass
from importlib import resources
from typing import Any

import numpy as np

from eaglekit.errors import CheckpointError, UsageError
from eaglekit.io.jsonfile import open_regular
from eaglekit.progress import Progress, quiet
from eaglekit.upgrade.calibrate import FcNormFit, Fidelity, fc_fidelity

SEQUENCE_LENGTH = 256
HELD_OUT_FRACTION = 0.25
CALIBRATION_READ_BYTES = 16 * 1024 * 1024
"""Read of a calibration file at most: the calibration tokens (a few thousand) never spell more, so a larger file is
used for its start; a FIFO or device is refused (open_regular)."""


@dataclass(frozen=True)
class CapturedSequence:
    tokens: Any  # torch.LongTensor [S]
    aux: Any  # torch.FloatTensor [S, K*T]: the K aux states (ascending id) of each position, concatenated


@dataclass(frozen=True)
class CalibrationCapture:
    fit: list[CapturedSequence]
    held_out: list[CapturedSequence]
    text_source: str
    embed_tokens: Any  # the target's input embedding [V, T], for drafts that share it

    def chunks(self, part: list[CapturedSequence], k: int) -> list[np.ndarray]:
        """The K aux states of `part` as K arrays [N, T] (position 0 of each sequence left out)."""
        joined = np.concatenate([s.aux[1:].numpy() for s in part])
        width = joined.shape[1] // k
        return [joined[:, i * width:(i + 1) * width] for i in range(k)]


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
    with open_regular(path, "calibration file") as fh:
        try:
            data = fh.read(CALIBRATION_READ_BYTES)
        except OSError as exc:
            raise UsageError(f"cannot read the calibration file ({exc.strerror or exc})", path) from None
    try:  # a character cut by the byte bound is dropped; an invalid one is refused
        return codecs.getincrementaldecoder("utf-8")().decode(data, final=len(data) < CALIBRATION_READ_BYTES), path
    except UnicodeDecodeError as exc:
        raise UsageError(f"the calibration file is not UTF-8 text (byte {exc.start})", path) from None


def _sequences(ids: list[int]) -> list[list[int]]:
    chunks = (ids[i:i + SEQUENCE_LENGTH] for i in range(0, len(ids), SEQUENCE_LENGTH))
    return [c for c in chunks if len(c) > 1]


def calibration_sequences(tokenizer, *, text_file: str | None = None, max_tokens: int = 2048
                          ) -> tuple[list[list[int]], list[list[int]], str]:
    """(fit sequences, held-out sequences, where the text came from): the calibration text's first `max_tokens`
    tokens, the last quarter held out, each part cut into SEQUENCE_LENGTH-token sequences."""
    from eaglekit.decode.prompts import leading_text

    text, where = calibration_text(text_file)
    ids = list(tokenizer(leading_text(text, tokenizer, max_tokens), add_special_tokens=True,
                         verbose=False)["input_ids"])[:max_tokens]
    held = max(SEQUENCE_LENGTH // 4, int(len(ids) * HELD_OUT_FRACTION))
    if len(ids) - held < 64:
        raise UsageError(f"calibration text is too short: {len(ids)} tokens (need at least {64 + held})", where)
    return _sequences(ids[:-held]), _sequences(ids[-held:]), where


def capture_calibration(target_dir: str, aux_ids: tuple[int, ...], *, text_file: str | None = None,
                        max_tokens: int = 2048, device: str = "cpu", quantization: str | None = None,
                        progress: Progress | None = None, purpose: str = "capturing calibration states"
                        ) -> CalibrationCapture:
    """One target pass over the calibration text, keeping tokens and the aux states `aux_ids` (vLLM convention);
    with `quantization`, the target computes as that format serves it (the states a served drafter sees).
    `progress` hears of the load, then of the pass (`purpose` names it) sequence by sequence."""
    import torch

    from eaglekit.target_model import load_target

    progress = quiet(progress)
    progress.stage("loading the target")
    target = load_target(target_dir, device=device, dtype="auto", quantization=quantization)
    if target.tokenizer is None:
        raise CheckpointError("the target has no tokenizer; calibration needs one to read the text", target_dir)
    fit, held_out, where = calibration_sequences(target.tokenizer, text_file=text_file, max_tokens=max_tokens)
    tokens_in = sum(map(len, fit + held_out))
    progress.stage(purpose, tokens_in, "tokens")

    def run(part: list[list[int]]) -> list[CapturedSequence]:
        out = []
        for seq in part:
            tokens = torch.tensor([seq], dtype=torch.long)
            aux = target.forward(tokens, aux_ids, logits_to_keep=1).aux
            out.append(CapturedSequence(tokens[0], torch.cat([a[0].float().cpu() for a in aux], dim=-1)))
            progress.advance(len(seq))
        return out

    captured = CalibrationCapture(run(fit), run(held_out), where, target.embed_tokens.detach().float().cpu())
    progress.done()
    return captured


def fit_fc_norm(capture: CalibrationCapture, num_aux: int, fc_weight: np.ndarray, *, eps: float,
                dtype: str) -> Calibration:
    """Least-squares fc_norm weights from the fit part, measured through `fc_weight` on the held-out part."""
    fit_chunks = capture.chunks(capture.fit, num_aux)
    fit = FcNormFit(num_aux, fit_chunks[0].shape[1], eps, dtype)
    fit.update(fit_chunks)
    weights = fit.weights()
    held = capture.chunks(capture.held_out, num_aux)
    return Calibration(
        weights=weights,
        fit_tokens=fit.tokens,
        calibrated=fc_fidelity(fc_weight, held, weights, eps, dtype),
        ones=fc_fidelity(fc_weight, held, np.ones_like(weights), eps, dtype),
        text_source=capture.text_source,
    )
