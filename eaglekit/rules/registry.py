"""Rules are data: a stable code, a severity, a group, the pitfall it guards, and a check that yields hits."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING

from eaglekit.engines import SglangView, Version, VllmView, sglang_view, vllm_view
from eaglekit.engines.tokenspeed import TokenspeedView, tokenspeed_view
from eaglekit.engines.trtllm import TrtllmView, trtllm_view
from eaglekit.findings import SEVERITIES
from eaglekit.spec import DraftSpec
from eaglekit.target import TargetInfo

if TYPE_CHECKING:
    from eaglekit.rules.expected import TensorExpectation
    from eaglekit.rules.scan import TensorStats

GROUPS = ("structure", "target", "engine", "deep")


@dataclass(frozen=True)
class Hit:
    """One occurrence of a rule: the message and where (a tensor name or a config key)."""

    message: str
    tensor: str | None = None
    key: str | None = None
    refuses_load: bool | None = None  # overrides the rule's own `refuses_load` for this occurrence


@dataclass
class RuleContext:
    """What a check may look at; expensive views are computed once and shared by every rule."""

    spec: DraftSpec
    target: TargetInfo | None
    engine: str | None
    version: Version | None  # the engine version checked (None for engine-independent rules)
    memo: dict = field(default_factory=dict)  # results several rules share (e.g. the d2t/t2d verdict)

    @property
    def checked_version(self) -> Version:
        """The engine version an engine rule checks: engine rules always run with one."""
        if self.version is None:
            raise ValueError(f"an engine rule ran without an engine version ({self.engine})")
        return self.version

    @cached_property
    def expectations(self) -> list[TensorExpectation]:
        from eaglekit.rules.expected import tensor_expectations

        return tensor_expectations(self.spec)

    @cached_property
    def vllm(self) -> VllmView:
        return vllm_view(self.spec, self.version)

    @cached_property
    def sglang(self) -> SglangView:
        return sglang_view(self.spec, self.target)

    @cached_property
    def trtllm(self) -> TrtllmView:
        return trtllm_view(self.spec)

    @cached_property
    def tokenspeed(self) -> TokenspeedView:
        return tokenspeed_view(self.spec, self.target)

    @cached_property
    def stats(self) -> dict[str, TensorStats]:
        from eaglekit.rules.scan import scan_draft

        return scan_draft(self.spec)


Check = Callable[[RuleContext], Iterable[Hit]]


@dataclass(frozen=True)
class Rule:
    code: str
    severity: str
    group: str
    pitfall: str | None
    title: str
    check: Check = field(repr=False, compare=False)
    engine: str | None = None  # engine rules: the engine whose behaviour they describe
    refuses_load: bool = False  # a hit means the engine's loader raises on these files (not a silent misreading)
    convertible: bool = True  # engine rules: `eaglekit upgrade` can write what the engine needs
    refuses_upgrade: bool = False  # an error here is what `eaglekit upgrade` refuses the source for (one rule, both)

    def to_dict(self) -> dict:
        return {"code": self.code, "severity": self.severity, "group": self.group, "engine": self.engine,
                "pitfall": self.pitfall, "title": self.title}


_RULES: dict[str, Rule] = {}


def rule(code: str, severity: str, group: str, pitfall: str | None, title: str, engine: str | None = None,
         refuses_load: bool = False, convertible: bool = True, refuses_upgrade: bool = False):
    """Register a check under a stable code; `refuses_load`: the engine will not load a draft this rule hits;
    `convertible=False`: no rewrite of the files serves the draft on that engine (a function it lacks);
    `refuses_upgrade`: upgrade will not convert a source this rule hits (header-only error rules)."""
    if severity not in SEVERITIES or group not in GROUPS:
        raise ValueError(f"rule {code}: bad severity {severity!r} or group {group!r}")
    if (group == "engine") != (engine is not None):
        raise ValueError(f"rule {code}: engine rules, and only they, name an engine")
    if refuses_upgrade and (severity != "error" or group not in ("structure", "engine")):
        raise ValueError(f"rule {code}: only header-level error rules can refuse an upgrade")

    def register(fn: Check) -> Check:
        if code in _RULES:
            raise ValueError(f"rule code {code} registered twice")
        _RULES[code] = Rule(code, severity, group, pitfall, title, fn, engine, refuses_load, convertible,
                            refuses_upgrade)
        return fn

    return register


def registered() -> list[Rule]:
    return sorted(_RULES.values(), key=lambda r: r.code)


# upgrade's read-back rules register here, so every import of the registry knows their codes
import eaglekit.rules.readback  # noqa: E402,F401
