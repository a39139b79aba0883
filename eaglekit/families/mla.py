"""Kimi / DeepSeek MLA drafts (F9) without a producer marker: nested ids, convention by the first id (P47)."""

from eaglekit.families.base import Observed, Traits, family


@family("mla", priority=95,
        traits=Traits("MLA draft", None, ("top-level", "eagle_config"), False))
class MlaDraft:
    @staticmethod
    def matches(obs: Observed) -> bool:
        return obs.is_mla
