"""Rules are data: a stable code, a severity, a group, the pitfall it guards, and a check that yields hits."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING

from eaglekit.engines import SglangView, Version, VllmView, sglang_view, vllm_view
from eaglekit.engines.tokenspeed import TokenspeedView, tokenspeed_view
from eaglekit.engines.trtllm import TrtllmView, trtllm_view
from eaglekit.findings import SEVERITIES, Finding
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
    """A registered check: its stable code, severity, group, pitfall and the function that finds its hits."""

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
    fix: str | None = None  # what to do about a hit, where it is not the upgrade (rules.rule_fix derives that one)

    @property
    def fixed_by_upgrade(self) -> bool:
        """`eaglekit upgrade` writes what this engine rule checks: its fix is that command (rules.fix_command), not
        a sentence of its own; an upgrade refused for the very finding, or a function the engine lacks, is none."""
        return self.engine is not None and self.convertible and not self.refuses_upgrade and self.fix is None

    def to_dict(self) -> dict:
        return {"code": self.code, "severity": self.severity, "group": self.group, "engine": self.engine,
                "pitfall": self.pitfall, "title": self.title}

    def findings(self, ctx: RuleContext) -> list[Finding]:
        """This rule's hits in `ctx`, as the findings every caller reports."""
        return [Finding(self.code, self.severity, hit.message, self.pitfall, hit.tensor, hit.key,
                        self.refuses_load if hit.refuses_load is None else hit.refuses_load)
                for hit in self.check(ctx)]


_RULES: dict[str, Rule] = {}


def rule(code: str, severity: str, group: str, pitfall: str | None, title: str, engine: str | None = None,
         refuses_load: bool = False, convertible: bool = True, refuses_upgrade: bool = False, fix: str | None = None):
    """Register a check under a stable code; `refuses_load`: the engine will not load a draft this rule hits;
    `convertible=False`: no rewrite of the files serves the draft on that engine (a function it lacks; `fix` says
    what serves it instead); `refuses_upgrade`: upgrade will not convert a source this rule hits (header-only error
    rules); `fix`: one sentence on what to do about a hit, for every rule whose fix is not `eaglekit upgrade`."""
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
                            refuses_upgrade, fix)
        return fn

    return register


def registered() -> list[Rule]:
    return sorted(_RULES.values(), key=lambda r: r.code)



# ---------------------------------------------------------------- upgrade's read-back rules
# An upgrade's output, re-read as eaglekit reads any draft, must say exactly what was decided. These rules judge it
# against what the upgrade planned, which only `eaglekit upgrade` holds: it puts a ReadBack in the context's memo
# (eaglekit.upgrade.check). An ordinary rules run has none, and they stay silent there.

READBACK = "upgrade_readback"  # the memo key
READBACK_CODES = ("EK191", "EK192", "EK193", "EK194", "EK195")
READBACK_FLAGS = ("fc_norm", "norm_output", "norm_before_residual")
READBACK_FIX = ("nothing in the source: the upgrade's output did not read back as planned, an eaglekit defect; "
                "report it with the command and the source's config.json")


@dataclass(frozen=True)
class ReadBack:
    """What an upgrade planned and decided its output to be, and how the output was re-read (named in messages)."""

    tensors: dict[str, tuple[str, tuple[int, ...]]]  # planned name as written -> (dtype, shape)
    aux_ids: tuple[int, ...] | None
    num_aux: int | None
    flags: dict[str, bool]  # READBACK_FLAGS as decided
    how: str  # "read as vllm", "detected as speculators", ...


def _read_back(ctx: RuleContext) -> ReadBack | None:
    return ctx.memo.get(READBACK)


def _written(spec: DraftSpec) -> dict[str, tuple[str, tuple[int, ...]]]:
    return {t.source_name: (t.dtype, tuple(t.shape)) for t in spec.tensors.values()}


@rule("EK191", "error", "structure", None, "upgrade output: a planned tensor missing, or one written unplanned",
      fix=READBACK_FIX)
def readback_tensor_set(ctx: RuleContext):
    rb = _read_back(ctx)
    if rb is None:
        return
    for name in sorted(rb.tensors.keys() ^ _written(ctx.spec).keys()):
        where = "missing from" if name in rb.tensors else "not planned in"
        yield Hit(f"tensor {name!r} {where} the output ({rb.how})", tensor=name)


@rule("EK192", "error", "structure", None, "upgrade output: a tensor's dtype or shape is not the planned one",
      fix=READBACK_FIX)
def readback_tensor_shape(ctx: RuleContext):
    rb = _read_back(ctx)
    if rb is None:
        return
    written = _written(ctx.spec)
    for name in sorted(rb.tensors.keys() & written.keys()):
        if rb.tensors[name] != written[name]:
            yield Hit(f"tensor {name!r} is {written[name]}, planned {rb.tensors[name]} ({rb.how})", tensor=name)


@rule("EK193", "error", "structure", None, "upgrade output: aux layer ids read back are not the decided ones",
      fix=READBACK_FIX)
def readback_aux_ids(ctx: RuleContext):
    rb = _read_back(ctx)
    if rb is not None and ctx.spec.aux.ids != rb.aux_ids:
        yield Hit(f"aux ids read back as {ctx.spec.aux.ids}, decided {rb.aux_ids} ({rb.how})",
                  key="eagle_aux_hidden_state_layer_ids")


@rule("EK194", "error", "structure", None, "upgrade output: K read back is not the decided one",
      fix=READBACK_FIX)
def readback_k(ctx: RuleContext):
    rb = _read_back(ctx)
    if rb is not None and ctx.spec.num_aux_hidden_states != rb.num_aux:
        yield Hit(f"K read back as {ctx.spec.num_aux_hidden_states}, decided {rb.num_aux} ({rb.how})")


@rule("EK195", "error", "structure", None, "upgrade output: a norm flag read back is not the decided one",
      fix=READBACK_FIX)
def readback_flags(ctx: RuleContext):
    rb = _read_back(ctx)
    if rb is None:
        return
    for key in READBACK_FLAGS:
        read = getattr(ctx.spec.flags, key)
        if read != rb.flags[key]:
            yield Hit(f"{key} read back as {read}, decided {rb.flags[key]} ({rb.how})", key=key)
