"""The decode rules (EK291..EK299), on real bytes: what verify, compare and finetune's evaluation refuse a draft for
before anything loads, or warn about. A draft with the defect makes the rule fire; its healthy twin has no decode
finding at all; an ordinary rules run (validate) leaves them silent, having no decode to hold the draft to."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from eaglekit.families import load_draft
from eaglekit.rules import all_rules, decode_findings, run_rules
from eaglekit.rules.target import DECODE_CODES
from eaglekit.target import read_target
from tests.support.factory import Recipe, canonical_tensors, make_draft, make_target_config

RULES = {r.code: r for r in all_rules()}
FILES = "files"  # decode the ids the files record, as verify does without --aux-layer-ids


def draft(p: Path, layout: str = "vllm", **kw) -> str:
    return make_draft(str(p / "draft"), layout, **kw)


def target(p: Path, **kw) -> str:
    return make_target_config(str(p / "target"), **kw)


def d2t_with(edit) -> dict:
    d2t = canonical_tensors(Recipe())["d2t"].copy()
    edit(d2t)
    return {"d2t": d2t}


def _out_of_range(d2t):
    d2t[-1] = 10_000


def _two_to_one(d2t):
    d2t[1] = d2t[0] - 1  # draft 1 -> the target id of draft 0


@dataclass
class Case:
    code: str
    broken: Callable[[Path], tuple[str, str]]
    healthy: Callable[[Path], tuple[str, str]]
    label: str
    aux_ids: object = FILES  # FILES, an --aux-layer-ids override, or None (neither the files nor the user say)
    fragment: str = ""  # what the message says

    @property
    def id(self) -> str:
        return f"{self.code}-{self.label}"


CASES = [
    Case("EK291", lambda p: (draft(p, "sglang", config_patch={"vocab_size": None}), target(p)),
         lambda p: (draft(p, "sglang"), target(p)), "vocab-unrecorded", fragment="V=256 is assumed"),
    Case("EK292", lambda p: (draft(p), target(p, vocab=300)), lambda p: (draft(p), target(p)), "vocab",
         fragment="draft vocabulary V=256, the target has V=300"),
    Case("EK293", lambda p: (draft(p, target_hidden=96, embed=True), target(p)),
         lambda p: (draft(p, target_hidden=96, embed=True), target(p, hidden=96)), "written-T",
         fragment="T=96, the target has T=64"),
    Case("EK293", lambda p: (draft(p, target_hidden=96, embed=True, config_patch={"target_hidden_size": None}),
                             target(p)),
         lambda p: (draft(p, target_hidden=96, embed=True), target(p, hidden=96)), "fc-in-features",
         fragment="fc takes 288 inputs, not a multiple of the target's hidden size T=64"),
    Case("EK294", lambda p: (draft(p), target(p)), lambda p: (draft(p), target(p)), "outside", aux_ids=(2, 6, 13),
         fragment="[13] lie outside [0, L=12]"),
    Case("EK294", lambda p: (draft(p), target(p)), lambda p: (draft(p), target(p)), "duplicates", aux_ids=(2, 6, 6),
         fragment="have duplicates (P20)"),
    Case("EK294", lambda p: (draft(p), target(p)), lambda p: (draft(p), target(p)), "not-K", aux_ids=(2, 6),
         fragment="fc takes K=3"),
    Case("EK294", lambda p: (draft(p), target(p)), lambda p: (draft(p), target(p)), "unknown", aux_ids=None,
         fragment="pass --aux-layer-ids"),
    Case("EK295", lambda p: (draft(p, embed=True, draft_vocab=None), target(p, vocab=300)),
         lambda p: (draft(p, embed=True, draft_vocab=None), target(p)), "own-shape", fragment="expected [V=300, H=64]"),
    Case("EK295", lambda p: (draft(p, target_hidden=96), target(p, hidden=96)),
         lambda p: (draft(p, target_hidden=96, embed=True), target(p, hidden=96)), "not-shareable",
         fragment="cannot be shared (P26)"),
    Case("EK296", lambda p: (draft(p, lm_head=False), target(p)),
         lambda p: (draft(p, lm_head=False, draft_vocab=None), target(p)), "smaller-vocab-shared",
         fragment="Vd=128 is not the target's V=256 (P5)"),
    Case("EK297", lambda p: (draft(p, drop=("d2t", "t2d")), target(p)), lambda p: (draft(p), target(p)), "no-d2t",
         fragment="maps draft id i to target id i"),
    Case("EK298", lambda p: (draft(p, add=d2t_with(_out_of_range)), target(p)), lambda p: (draft(p), target(p)),
         "out-of-range", fragment="outside the target vocabulary [0, 256)"),
    Case("EK298", lambda p: (draft(p, add=d2t_with(_two_to_one)), target(p)), lambda p: (draft(p), target(p)),
         "two-to-one", fragment="two draft ids to the same target id"),
    Case("EK299", lambda p: (draft(p, "specforge"), target(p)), lambda p: (draft(p), target(p)), "served-otherwise",
         fragment="differs from this reading: EK307"),
]


def _decode(builder, where: Path, aux_ids=FILES):
    where.mkdir(parents=True, exist_ok=True)
    path, target_path = builder(where)
    info = read_target(target_path)
    spec = load_draft(path, target=info)
    served = run_rules(spec, target=info, engine="vllm", groups=("structure", "target", "engine"))
    ids = spec.aux.ids if aux_ids == FILES else aux_ids
    return decode_findings(spec, info, ids, spec.aux.source, served), served


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_decode_rule_fires_on_the_broken_pair(case, tmp_path):
    findings, served = _decode(case.broken, tmp_path, case.aux_ids)
    fired = [f for f in findings if f.code == case.code]
    assert fired, f"{case.code} did not fire; got {[(f.code, f.message) for f in findings]}"
    for f in fired:
        assert f.severity == RULES[case.code].severity and f.pitfall == RULES[case.code].pitfall
        assert "\n" not in f.message and case.fragment in f.message
    assert not {f.code for f in served.findings} & set(DECODE_CODES)  # validate's run never holds it to a decode


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_healthy_twin_has_no_decode_finding(case, tmp_path):
    findings, _ = _decode(case.healthy, tmp_path)
    assert not findings, [(f.code, f.message) for f in findings]


def test_every_decode_rule_has_a_case_and_is_a_target_rule():
    assert {c.code for c in CASES} == set(DECODE_CODES)
    assert {RULES[code].group for code in DECODE_CODES} == {"target"}


def test_the_served_warning_names_the_upgrade_that_fixes_it(tmp_path):
    findings, served = _decode(CASES[-1].broken, tmp_path)
    (warning,) = [f for f in findings if f.code == "EK299"]
    assert served.fix and f"`{served.fix}` writes what it reads" in warning.message
    assert "`--engine both` measures what it does" in warning.message
    errors = served.errors
    assert errors == 1 or f"(+{errors - 1} more)" in warning.message


def test_a_fix_with_a_path_too_long_to_quote_whole_is_named_not_printed_cut(tmp_path):
    findings, served = _decode(CASES[-1].broken, tmp_path / ("d" * 90))
    (warning,) = [f for f in findings if f.code == "EK299"]
    assert served.fix and served.fix not in warning.message and "…" not in warning.message
    assert "`eaglekit validate` prints the command" in warning.message
