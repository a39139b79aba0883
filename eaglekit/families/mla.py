"""Kimi / DeepSeek MLA drafts (F9) without a producer marker: nested ids, convention by the first id (P47)."""

from eaglekit.families.base import Observed, Traits

PRIORITY = 95


def matches(obs: Observed) -> bool:
    return obs.is_mla


def traits(obs: Observed) -> Traits:
    return Traits("mla", "MLA draft", None, ("top-level", "eagle_config"), False)
