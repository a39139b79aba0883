"""The draft-vocabulary map of the output: d2t only when Vd < V, sorted ids, a t2d that agrees (reference §6).

Sorting a frequency-ordered map is lossless: lm_head row j and d2t entry j move together, so every draft
logit still lands on the same target token.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from eaglekit.errors import CheckpointError, UsageError
from eaglekit.io.tensors import read_array
from eaglekit.spec import DraftSpec


@dataclass(frozen=True)
class VocabPlan:
    vocab_size: int  # V
    draft_vocab_size: int  # Vd
    action: str  # "none" | "kept" | "sorted" | "identity-dropped"
    detail: str
    row_order: np.ndarray | None  # lm_head row j of the output = source row row_order[j]; None: unchanged
    d2t: np.ndarray | None  # int64 offsets to write; None: no d2t in the output
    t2d: np.ndarray | None  # bool [V] to write; None: no t2d in the output
    t2d_from_source: bool  # the source t2d is written unchanged (byte copy)
    d2t_from_source: bool  # the source d2t is written unchanged (byte copy)


def plan_vocab(spec: DraftSpec, vocab_size: int | None) -> VocabPlan:
    vd = spec.vocab.draft_vocab_size
    if vocab_size is None:
        raise UsageError(f"{spec.path}: the target vocabulary size V is unknown (no vocab_size in the config, no "
                         "embed_tokens); pass --target")
    v = vocab_size
    if vd > v:
        raise CheckpointError(f"draft vocabulary ({vd}) is larger than the target vocabulary ({v})", spec.path)
    if "d2t" not in spec.tensors:
        if vd < v:
            raise CheckpointError(f"draft vocabulary Vd={vd} < V={v} but the checkpoint has no d2t map (P4): "
                                  "which target token each lm_head row scores is lost", spec.path)
        return VocabPlan(v, vd, "none", "Vd == V: no vocabulary map", None, None, None, False, False)
    if spec.tensors["d2t"].shape != (vd,):
        raise CheckpointError(f"d2t has shape {list(spec.tensors['d2t'].shape)}, expected [{vd}]", spec.path)

    d2t = np.asarray(read_array(spec, "d2t")).astype(np.int64)
    ids = np.arange(vd, dtype=np.int64) + d2t
    if ids.min(initial=0) < 0 or ids.max(initial=0) >= v or len(np.unique(ids)) != vd:
        absolute = d2t.min(initial=0) >= 0 and d2t.max(initial=0) < v and len(np.unique(d2t)) == vd
        hint = " (it looks like absolute ids, not offsets: P24)" if absolute else " (P24)"
        raise CheckpointError(f"d2t does not map draft ids to distinct target ids in [0, {v}){hint}", spec.path)

    order = np.argsort(ids, kind="stable")
    is_sorted = bool(np.all(order == np.arange(vd)))
    sorted_ids = ids[order]

    t2d_ok = False
    if "t2d" in spec.tensors:
        t2d_src = np.asarray(read_array(spec, "t2d")).astype(bool)
        t2d_ok = t2d_src.shape == (v,) and int(t2d_src.sum()) == vd and bool(np.all(t2d_src[ids]))
    if vd == v:
        if is_sorted:
            return VocabPlan(v, vd, "identity-dropped", "d2t is the identity (Vd == V): d2t and t2d dropped (P23)",
                             None, None, None, False, False)
        return VocabPlan(v, vd, "identity-dropped",
                         "Vd == V with a permuted d2t: lm_head rows put in target order, d2t and t2d dropped (P23)",
                         order, None, None, False, False)

    t2d = np.zeros(v, dtype=bool)
    t2d[ids] = True
    t2d_note = "t2d kept" if t2d_ok else ("t2d rebuilt from d2t (the source t2d disagrees)" if "t2d" in spec.tensors
                                         else "t2d added from d2t")
    if is_sorted:
        return VocabPlan(v, vd, "kept", f"d2t kept (sorted); {t2d_note}", None, d2t, t2d, t2d_ok, True)
    new_d2t = sorted_ids - np.arange(vd, dtype=np.int64)
    return VocabPlan(v, vd, "sorted",
                     f"frequency-ordered d2t sorted: lm_head rows and d2t permuted together (lossless); {t2d_note}",
                     order, new_d2t, t2d, t2d_ok, False)
