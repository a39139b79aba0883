"""Deep rules: judge tensor values, from the single streaming pass of `scan.scan_draft` (torch-free)."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from eaglekit.rules.facts import claims_31, is_norm
from eaglekit.rules.registry import Hit, RuleContext, rule

if TYPE_CHECKING:  # numpy is imported where values are judged: loading the rules (inspect) stays numpy-free
    import numpy as np


def _weights(ctx: RuleContext):
    for st in ctx.stats.values():
        if st.error is None and st.skipped is None and st.values is None and st.shape:
            yield st


@rule("EK401", "error", "deep", "P1", "NaN or Inf values",
      fix="re-export from the last training checkpoint that holds finite values")
def nonfinite(ctx: RuleContext):
    for st in _weights(ctx):
        if st.nonfinite:
            yield Hit(f"{st.name} holds NaN or Inf values: a diverged or corrupt export", tensor=st.name)


@rule("EK402", "error", "deep", "P5", "a weight matrix or norm that is all zero",
      fix="re-export the tensor from the training checkpoint: it was never trained or never loaded")
def all_zero(ctx: RuleContext):
    for st in _weights(ctx):
        if st.all_zero and (len(st.shape) >= 2 or is_norm(st.name)) and not st.name.endswith("_scale"):
            yield Hit(f"{st.name} {list(st.shape)} is all zero: never trained or never loaded", tensor=st.name)


@rule("EK403", "error", "deep", "P1", "a weight matrix with one constant value",
      fix="re-export the trained weights from the training checkpoint")
def constant(ctx: RuleContext):
    for st in _weights(ctx):
        if (st.constant and not st.all_zero and len(st.shape) >= 2 and math.prod(st.shape) > 1
                and not st.name.endswith("_scale")):
            yield Hit(f"{st.name} {list(st.shape)} holds a single repeated value: an initialiser, not trained weights",
                      tensor=st.name)


def _all_one_norms(ctx: RuleContext) -> list[str]:
    return [st.name for st in _weights(ctx) if is_norm(st.name) and len(st.shape) == 1 and st.all_one]


@rule("EK404", "warning", "deep", "P3", "norm weights exactly 1.0 in a draft that claims EAGLE-3.1",
      fix="restore the trained norm weights from the training checkpoint, or train them with `eaglekit finetune`")
def ones_in_31(ctx: RuleContext):
    if claims_31(ctx.spec):
        for name in _all_one_norms(ctx):
            yield Hit(f"{name} is exactly 1.0 everywhere although the draft claims EAGLE-3.1: freshly initialised "
                      "(dropped by a converter, or flags switched on without training)", tensor=name)


@rule("EK405", "info", "deep", "P1", "norm weights exactly 1.0",
      fix="check that the norms were trained; if not, restore them from the training checkpoint")
def ones(ctx: RuleContext):
    if not claims_31(ctx.spec):
        for name in _all_one_norms(ctx):
            yield Hit(f"{name} is exactly 1.0 everywhere, the initial value: trained norms rarely are", tensor=name)


@rule("EK406", "warning", "deep", "P5", "lm_head rows that are all zero",
      fix="nothing if the rows are padding; otherwise restore lm_head.weight from the training checkpoint")
def zero_head_rows(ctx: RuleContext):
    st = ctx.stats.get("lm_head.weight")
    if st and st.zero_rows and not st.all_zero:
        yield Hit(f"lm_head.weight has {st.zero_rows} all-zero row(s) of {st.shape[0]}: those draft tokens score "
                  "exactly 0 (untrained or padded rows)", tensor="lm_head.weight")


def _vocab_verdict(d2t: np.ndarray, t2d: np.ndarray | None, V: int | None) -> dict[str, str]:
    """Every d2t/t2d finding at once (reference §6.2), keyed by rule code; absolute ids explain the rest."""
    import numpy as np

    Vd = d2t.size
    ids = np.arange(Vd, dtype=np.int64) + d2t
    upper = V if V is not None else np.iinfo(np.int64).max
    out: dict[str, str] = {}
    bad_range = (ids < 0) | (ids >= upper)
    n_unique = np.unique(ids).size
    ok_absolute = bool(((d2t >= 0) & (d2t < upper)).all() and np.unique(d2t).size == Vd)
    target_set = np.flatnonzero(t2d) if t2d is not None else None
    ids_valid = not bad_range.any() and n_unique == Vd
    if target_set is not None and ids_valid:
        ids_valid = target_set.size == Vd and np.array_equal(np.sort(ids), target_set)
    if not ids_valid and ok_absolute and (target_set is None or np.array_equal(np.sort(d2t), target_set)):
        out["EK409"] = ("d2t holds absolute target ids, not offsets (target = draft id + d2t): every draft token maps "
                        "to the wrong target token; store d2t - arange(Vd)")
        return out
    if bad_range.any():
        first = int(np.flatnonzero(bad_range)[0])
        out["EK407"] = (f"{int(bad_range.sum())} draft id(s) map outside [0, {V}) (first: draft {first} -> "
                        f"{int(ids[first])})")
    if n_unique != Vd:
        out["EK408"] = f"{Vd - n_unique} draft id(s) map to a target id another draft id already has"
    if t2d is not None and target_set is not None:
        if int(t2d.sum()) != Vd:
            out["EK410"] = f"t2d marks {int(t2d.sum())} target tokens but the draft vocabulary has Vd={Vd}"
        elif not bad_range.any() and not np.array_equal(np.sort(ids), target_set):
            differ = np.setdiff1d(ids, target_set).size
            out["EK411"] = f"t2d and d2t disagree on {differ} target id(s): consumers that read t2d are misled"
    if Vd > 1 and not bad_range.any() and n_unique == Vd and (np.diff(ids) < 0).any():
        out["EK413"] = ("d2t maps draft ids to target ids out of order (frequency-ordered, as ModelOpt writes): valid "
                        "for vLLM and SGLang; sort losslessly if a consumer requires ascending ids")
    if V is not None and Vd == V and not d2t.any():
        out["EK412"] = "d2t is all zero with Vd == V: the identity map; drop d2t and t2d"
    return out


def _verdict(ctx: RuleContext) -> dict[str, str]:
    import numpy as np

    if "vocab" not in ctx.memo:
        d2t, t2d = ctx.stats.get("d2t"), ctx.stats.get("t2d")
        verdict: dict[str, str] = {}
        if d2t is not None and d2t.values is not None and d2t.values.ndim == 1 and d2t.values.dtype.kind in "iu":
            mask = (t2d.values.astype(np.bool_) if t2d is not None and t2d.values is not None and t2d.values.ndim == 1
                    else None)
            verdict = _vocab_verdict(d2t.values.astype(np.int64), mask, ctx.spec.vocab.vocab_size)
        ctx.memo["vocab"] = verdict
    return ctx.memo["vocab"]


def _vocab_rule(code: str, severity: str, pitfall: str, title: str, tensor: str, fix: str):
    @rule(code, severity, "deep", pitfall, title, fix=fix)
    def check(ctx: RuleContext):
        message = _verdict(ctx).get(code)
        if message:
            yield Hit(message, tensor=tensor)

    return check


_D2T_FROM_TRAINING = "restore d2t from the training checkpoint"
_T2D_FROM_D2T = "rebuild t2d from d2t: true at exactly the Vd target ids d2t maps to"
_vocab_rule("EK407", "error", "P24", "d2t maps draft ids outside the target vocabulary", "d2t",
            f"{_D2T_FROM_TRAINING}: offsets that stay within the target vocabulary")
_vocab_rule("EK408", "error", "P24", "d2t maps two draft ids to one target id", "d2t",
            f"{_D2T_FROM_TRAINING}: one target id per draft id")
_vocab_rule("EK409", "error", "P24", "d2t stores absolute ids instead of offsets", "d2t",
            "store d2t as offsets: each target id minus its draft id")
_vocab_rule("EK410", "error", "P24", "t2d does not mark exactly Vd tokens", "t2d", _T2D_FROM_D2T)
_vocab_rule("EK411", "error", "P24", "t2d and d2t disagree", "t2d", _T2D_FROM_D2T)
_vocab_rule("EK412", "info", "P23", "identity d2t", "d2t", "drop d2t and t2d")
_vocab_rule("EK413", "info", "P24", "frequency-ordered d2t", "d2t",
            "nothing for vLLM and SGLang; sort it losslessly where a consumer needs ascending ids")


@rule("EK414", "error", "deep", None, "tensor bytes unreadable",
      fix="download or export the shard again: its bytes cannot be read")
def unreadable(ctx: RuleContext):
    for st in ctx.stats.values():
        if st.error:
            yield Hit(f"{st.name}: {st.error}", tensor=st.name)


@rule("EK415", "info", "deep", None, "tensor values not checked",
      fix="nothing to fix: the finding says why the values were not read")
def unchecked(ctx: RuleContext):
    for st in ctx.stats.values():
        if st.skipped:
            yield Hit(f"{st.name}: {st.skipped}", tensor=st.name)
