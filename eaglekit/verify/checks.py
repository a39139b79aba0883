"""Compatibility of a draft with a target, decided from configs and headers before any weight is loaded.

A failed check stops verify with one line: a draft whose vocabulary, target hidden size or aux ids do not
fit the target would otherwise crash mid-decode or, worse, decode garbage.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass

import numpy as np

from eaglekit.errors import IncompatibleDraftError, bounded_text
from eaglekit.io.tensors import read_array
from eaglekit.rules import ValidationReport, run_rules
from eaglekit.spec import DraftSpec
from eaglekit.target import TargetInfo

MAX_PATH_WORD = 512


@dataclass(frozen=True)
class Check:
    name: str
    status: str  # "pass" | "fail" | "warn" | "info"
    message: str

    def __post_init__(self):
        # the compatibility table shows every message: a hostile name in one is cut, not wrapped over pages;
        # the paths of a suggested command (the user's own, at most a few hundred characters) stay whole
        object.__setattr__(self, "message", bounded_text(self.message, word_limit=MAX_PATH_WORD))

    def to_dict(self) -> dict:
        return asdict(self)


def _target_hidden(spec: DraftSpec, target: TargetInfo) -> Check:
    T = target.hidden_size
    written = spec.facts.target_hidden_size_written or spec.facts.fc_norm_tensor_ids
    fc_in = spec.facts.fc_in_features
    draft_t = spec.geometry.target_hidden_size
    if written and draft_t != T:
        return Check("target_hidden_size", "fail",
                     f"draft expects target hidden size T={draft_t}, the target has T={T}")
    if fc_in is not None and fc_in % T:
        return Check("target_hidden_size", "fail",
                     f"fc takes {fc_in} inputs, not a multiple of the target's hidden size T={T}")
    how = "written in the draft config" if written else "from fc in-features"
    return Check("target_hidden_size", "pass", f"T={T} ({how})")


def _vocab(spec: DraftSpec, target: TargetInfo) -> Check:
    V = target.vocab_size
    draft_v = spec.vocab.vocab_size
    if draft_v is None:
        return Check("vocab_size", "info", f"draft does not record its vocabulary size; the target's V={V} is assumed")
    if draft_v != V:
        return Check("vocab_size", "fail", f"draft vocabulary V={draft_v}, the target has V={V}")
    return Check("vocab_size", "pass", f"V={V}")


def _aux(ids: Sequence[int] | None, source: str, k: int | None, target: TargetInfo) -> Check:
    L = target.num_layers
    if ids is None:
        return Check("aux_layer_ids", "fail",
                     f"aux layer ids are unknown ({source}); pass --aux-layer-ids (vLLM convention)")
    bad = [i for i in ids if not 0 <= i <= L]
    if bad:
        return Check("aux_layer_ids", "fail", f"aux layer ids {bad} lie outside [0, L={L}] of the target")
    if len(set(ids)) != len(ids):
        return Check("aux_layer_ids", "fail", f"aux layer ids {list(ids)} have duplicates (P20)")
    if k is not None and len(ids) != k:
        return Check("aux_layer_ids", "fail", f"{len(ids)} aux layer ids {list(ids)} but fc takes K={k} target states")
    return Check("aux_layer_ids", "pass", f"{list(ids)} in [0, L={L}] ({source})")


def _shared(spec: DraftSpec, target: TargetInfo) -> list[Check]:
    H, T, V = spec.geometry.hidden_size, target.hidden_size, target.vocab_size
    Vd = spec.vocab.draft_vocab_size or V
    checks = []
    if spec.has_embed_tokens:
        rows, width = spec.tensors["embed_tokens.weight"].shape
        ok = (rows, width) == (V, H)
        checks.append(Check("embed_tokens", "pass" if ok else "fail",
                            f"draft's own [{rows}, {width}]" + ("" if ok else f", expected [V={V}, H={H}]")))
    elif H == T:
        checks.append(Check("embed_tokens", "pass", "shared with the target (the draft ships none)"))
    else:
        checks.append(Check("embed_tokens", "fail",
                            f"the draft ships no embed_tokens and its H={H} differs from the target's T={T}: "
                            "the target's embedding cannot be shared (P26)"))
    if spec.has_lm_head:
        rows = spec.tensors["lm_head.weight"].shape[0]
        checks.append(Check("lm_head", "pass" if rows == Vd else "fail",
                            f"draft's own, {rows} rows" + ("" if rows == Vd else f", expected Vd={Vd}")))
    elif Vd != V:
        checks.append(Check("lm_head", "fail", f"the draft ships no lm_head but its vocabulary Vd={Vd} is not the "
                                               f"target's V={V} (P5)"))
    elif H != T:
        checks.append(Check("lm_head", "fail",
                            f"the draft ships no lm_head and its H={H} differs from the target's T={T}"))
    else:
        checks.append(Check("lm_head", "pass", "shared with the target (the draft ships none)"
                            + (", the target is tied: lm_head = embed_tokens" if target.tie_word_embeddings else "")))
    return checks


def _d2t(spec: DraftSpec, target: TargetInfo) -> Check | None:
    V, Vd = target.vocab_size, spec.vocab.draft_vocab_size
    if not Vd or Vd >= V:
        return None
    if "d2t" not in spec.tensors:
        return Check("d2t", "warn", f"draft vocabulary Vd={Vd} < V={V} but the draft has no d2t map (P4): vLLM "
                                    "silently maps draft id i to target id i, and so does this decode; the trained "
                                    "map is lost")
    ids = np.arange(Vd) + read_array(spec, "d2t").astype(np.int64).reshape(-1)[:Vd]
    if ids.min() < 0 or ids.max() >= V:
        return Check("d2t", "fail", f"d2t maps draft ids outside the target vocabulary [0, {V})")
    if len(np.unique(ids)) != Vd:
        return Check("d2t", "fail", "d2t maps two draft ids to the same target id")
    return Check("d2t", "pass", f"{Vd} draft ids map to distinct target ids")


def vllm_rules(spec: DraftSpec, target: TargetInfo, engine_version: str | None = None) -> ValidationReport:
    """The one rules run a decode command makes: vLLM's reading of the target-applied draft, at the version the
    command mirrors (the latest modelled by default); the compatibility table and the served section are views of
    it."""
    return run_rules(spec, target=target, engine="vllm", engine_version=engine_version,
                     groups=("structure", "target", "engine"))


def _served_as_written(report: ValidationReport) -> Check:
    """What vLLM does with these files as they are: the reference decodes eaglekit's reading, which may differ."""
    version = report.engines.get("vllm", "")
    errors = [f for f in report.findings if f.severity == "error"]
    if not errors:
        return Check("vllm_as_written", "pass",
                     f"vLLM {version} reads these files as eaglekit does (no engine-rule error)")
    more = f" (+{len(errors) - 1} more)" if len(errors) > 1 else ""
    fix = f"; `{report.fix}` writes what it reads" if report.fix else ""
    return Check("vllm_as_written", "warn", f"served as written, vLLM {version} differs from this reading: "
                                            f"{errors[0].code} {errors[0].message}{more}; `--engine both` measures "
                                            f"what it does{fix}")


def compatibility_checks(spec: DraftSpec, target: TargetInfo, aux_ids: Sequence[int] | None, aux_source: str,
                         num_aux: int | None, report: ValidationReport | None = None) -> list[Check]:
    """Every check, passing or not (they all go in the report). `spec` is the draft as written (what it records
    itself); `report` the command's rules run (`vllm_rules`), made here for a caller that has none."""
    checks = [_vocab(spec, target), _target_hidden(spec, target), _aux(aux_ids, aux_source, num_aux, target)]
    checks += _shared(spec, target)
    d2t = _d2t(spec, target)
    if d2t is not None:
        checks.append(d2t)
    checks.append(_served_as_written(report or vllm_rules(spec, target)))
    return checks


def refuse_failures(checks: Sequence[Check], draft_path: str) -> None:
    failed = [c for c in checks if c.status == "fail"]
    if failed:
        more = f" (and {len(failed) - 1} more failed check(s))" if len(failed) > 1 else ""
        raise IncompatibleDraftError(f"does not fit the target: {failed[0].message}{more}", draft_path)
