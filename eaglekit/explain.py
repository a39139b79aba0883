"""`eaglekit explain CODE`: what a rule code (EK…) or a pitfall id (P…) printed in any output means.

Rules come from the registry; pitfalls from the catalogue shipped with the package (eaglekit/data/pitfalls.json):
what goes wrong is told by its title, how it shows up, and how it can be seen in the files. A rule also says how to
fix what it finds (eaglekit.rules.rule_fix); a pitfall, through the rules that guard it.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from functools import cache
from importlib import resources
from typing import Any

from eaglekit.errors import UsageError

_RULE = re.compile(r"^EK\d{3}$")
_PITFALL = re.compile(r"^P\d{1,3}$")


@dataclass
class Explanation:
    code: str
    kind: str  # "rule" | "pitfall"
    title: str
    facts: dict[str, Any] = field(default_factory=dict)
    related: list[dict[str, Any]] = field(default_factory=list)  # the pitfall of a rule, or the rules of a pitfall
    fix: str | None = None  # a rule's: what to do about a hit (a pitfall's rules each carry theirs)

    def to_dict(self) -> dict[str, Any]:
        return {"code": self.code, "kind": self.kind, "title": self.title, "facts": self.facts,
                "related": self.related, "fix": self.fix}


@cache
def pitfalls() -> dict[str, dict[str, str | None]]:
    text = (resources.files("eaglekit") / "data" / "pitfalls.json").read_text(encoding="utf-8")
    return json.loads(text)


def _pitfall_summary(code: str) -> dict[str, Any]:
    entry = pitfalls().get(code) or {}
    return {"code": code, "title": entry.get("title"), "shows_up": entry.get("shows_up"), "detect": entry.get("detect")}


def explain(code: str) -> Explanation:
    from eaglekit.rules import all_rules, rule_fix

    wanted = code.strip().upper()
    rules = {r.code: r for r in all_rules()}
    if _RULE.match(wanted):
        if wanted not in rules:
            raise UsageError(f"no rule {wanted}; `eaglekit validate --list-rules` lists all {len(rules)}")
        r = rules[wanted]
        facts = {"severity": r.severity, "group": r.group, "engine": r.engine, "pitfall": r.pitfall,
                 "refuses_upgrade": True if r.refuses_upgrade else None}  # upgrade stops on this very finding
        return Explanation(r.code, "rule", r.title, facts, [_pitfall_summary(r.pitfall)] if r.pitfall else [],
                           rule_fix(r))
    if _PITFALL.match(wanted):
        if wanted not in pitfalls():
            raise UsageError(f"no pitfall {wanted}; the catalogue holds P1..P{len(pitfalls())}")
        entry = _pitfall_summary(wanted)
        guards = [{**r.to_dict(), "fix": rule_fix(r)} for r in rules.values() if r.pitfall == wanted]
        return Explanation(wanted, "pitfall", entry["title"] or wanted,
                           {"shows_up": entry["shows_up"], "detect": entry["detect"]}, guards)
    raise UsageError(f"{code!r} is neither a rule code (EK101) nor a pitfall id (P16)")
