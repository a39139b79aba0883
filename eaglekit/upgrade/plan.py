"""The plan: what every output tensor is made of, decided before a byte is written (printed by --dry-run).

Actions: copy (same name, same bytes), rename (new name, same bytes), transform (new bytes from a source
tensor: dtype cast, permuted rows, rebuilt map), add (new tensor), drop (source tensor not written).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from types import ModuleType
from typing import Any

from eaglekit.catalogue import carried, dropped, is_rotary_buffer, lookup
from eaglekit.errors import CheckpointError
from eaglekit.rules.expected import QuantCompanion, quant_companions
from eaglekit.spec import DraftSpec
from eaglekit.upgrade.decide import Decisions
from eaglekit.upgrade.encode import FLOAT_CASTABLE
from eaglekit.upgrade.vocab import VocabPlan

ACTIONS = ("copy", "rename", "transform", "add", "drop")

@dataclass(frozen=True)
class TensorStep:
    """One line of the plan."""

    name: str  # output name ("" for a drop)
    action: str
    dtype: str
    shape: tuple[int, ...]
    source: str | None  # source tensor name
    source_file: str | None
    note: str = ""
    canonical: str = ""  # the canonical name of what it writes or drops

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        del data["canonical"]
        data["shape"] = list(self.shape)
        return data


@dataclass(frozen=True)
class Recipe:
    """How the writer makes one output tensor's bytes."""

    kind: str  # "bytes" (source bytes) | "cast" | "rows" (permuted rows, maybe cast) | "array" (computed)
    source: str | None = None  # canonical source name
    cast_to: str | None = None
    array: str | None = None  # key into the computed arrays (fc_norm.{k}.weight, d2t, t2d, norm.weight)
    column_scale: str | None = None  # "rows": key of a per-column factor (the norm_output rescale of lm_head)


@dataclass
class UpgradePlan:
    steps: list[TensorStep]
    recipes: dict[str, Recipe] = field(default_factory=dict)  # output name -> recipe

    @property
    def written(self) -> list[TensorStep]:
        return [s for s in self.steps if s.action != "drop"]

    def counts(self) -> dict[str, int]:
        return {a: sum(1 for s in self.steps if s.action == a) for a in ACTIONS}

    @property
    def total_bytes(self) -> int:
        from eaglekit.io.dtypes import tensor_nbytes

        return sum(tensor_nbytes(s.dtype, s.shape) for s in self.written)


def _left_out(canonical: str) -> str:
    found = lookup(canonical)
    return (found[0].gguf_drop if found else None) or "no place for it in this output"


def build_plan(spec: DraftSpec, d: Decisions, vocab: VocabPlan, dialect: ModuleType) -> UpgradePlan:
    """Every output tensor's action and recipe, named in `dialect`; refused before a byte is written when the
    source holds tensors no engine loads, or a vocabulary map cannot be applied."""
    companions = {c.name: c for c in quant_companions(spec)}  # their problems were refused before (EK158)
    _refuse_unplannable(spec, vocab, companions)
    plan = _PlanBuilder(spec, dialect)
    for name in sorted(spec.tensors):
        _plan_source_tensor(plan, name, d, vocab, companions.get(name))
    if d.fc_norm_added:
        init = "least-squares fit on the target's hidden states" if d.fc_norm_init == "calibrated" else "unit weights"
        for k, layer in enumerate(d.aux.ids):
            key = f"fc_norm.{k}.weight"
            plan.add(key, "add", d.compute_dtype, (d.target_hidden,), None,
                     f"EAGLE-3.1 norm of aux layer {layer}: {init}", Recipe("array", array=key))
    _plan_vocab_maps(plan, vocab)
    plan.steps.sort(key=lambda s: (s.action == "drop", s.name or (s.source or "")))
    return UpgradePlan(plan.steps, plan.recipes)


def _refuse_unplannable(spec: DraftSpec, vocab: VocabPlan, companions: dict[str, QuantCompanion]) -> None:
    """Refuse tensors no EAGLE-3 engine loads (guessing what they are would publish a wrong draft), and a d2t
    that reorders rows when there is no lm_head to reorder."""
    unknown = sorted(n for n in spec.tensors if not carried(n) and n not in companions and not is_rotary_buffer(n))
    if unknown:
        shown = ", ".join(spec.tensors[n].source_name for n in unknown[:6])
        more = f" and {len(unknown) - 6} more" if len(unknown) > 6 else ""
        raise CheckpointError(f"tensors that no EAGLE-3 engine loads (P30): {shown}{more}; refusing to guess what "
                              "they are", spec.path)
    if vocab.row_order is not None and "lm_head.weight" not in spec.tensors:
        raise CheckpointError("d2t is not the identity but there is no lm_head to reorder", spec.path)


@dataclass
class _PlanBuilder:
    """The steps and recipes as they are planned: each tensor under the dialect's name for it."""

    spec: DraftSpec
    dialect: ModuleType
    steps: list[TensorStep] = field(default_factory=list)
    recipes: dict[str, Recipe] = field(default_factory=dict)

    def add(self, canonical: str, action: str, dtype: str, shape: tuple[int, ...], source: str | None, note: str,
            recipe: Recipe) -> None:
        """Write `canonical`; a source tensor the output format has no place for is dropped instead, and a copy
        whose name changes is a rename."""
        ref = self.spec.tensors.get(source) if source else None
        name = self.dialect.tensor_name(canonical, self.spec)
        if name is None:  # the output format has no such tensor
            if ref is not None:
                self.drop(canonical, _left_out(canonical))
            return
        if action in ("copy", "rename"):
            action = "copy" if ref is not None and ref.source_name == name else "rename"
        self.steps.append(TensorStep(name, action, dtype, tuple(shape), ref.source_name if ref else None,
                                     ref.file if ref else None, note, canonical))
        self.recipes[name] = recipe

    def drop(self, source: str, note: str) -> None:
        ref = self.spec.tensors[source]
        self.steps.append(TensorStep("", "drop", ref.dtype, ref.shape, ref.source_name, ref.file, note, source))


def _plan_source_tensor(plan: _PlanBuilder, name: str, d: Decisions, vocab: VocabPlan,
                        companion: QuantCompanion | None) -> None:
    """One source tensor's step: dropped, copied, cast, reordered into target-id order, or rescaled for
    norm_output (d2t and t2d are planned from the vocabulary plan instead)."""
    spec = plan.spec
    ref = spec.tensors[name]
    why_dropped = dropped(name, spec)
    if why_dropped:
        plan.drop(name, why_dropped)
        return
    if name in ("d2t", "t2d"):
        return
    dtype = ref.dtype
    if d.cast_to and ref.dtype in FLOAT_CASTABLE and not companion:  # scales stay in the dtype the kernels read
        dtype = d.cast_to
    note = ""
    if ref.source_name != plan.dialect.tensor_name(name, spec):
        note = "canonical name"
        if name.startswith("layers.") and "hidden_norm" in ref.source_name and "input_layernorm" in name:
            note = "Megatron hidden_norm of a layer >= 1 is its input norm (P32)"
    rescaled = d.norm_output_rescale and name in ("lm_head.weight", "norm.weight")
    if name == "lm_head.weight" and (vocab.row_order is not None or rescaled):
        what = [("rows reordered with d2t into target-id order" if vocab.row_order is not None else ""),
                ("the final norm's weight folded into its columns (norm_output rescale)" if rescaled else "")]
        plan.add(name, "transform", dtype, ref.shape, name, "; ".join(w for w in what if w),
                 Recipe("rows", name, cast_to=dtype if dtype != ref.dtype else None,
                        column_scale="lm_head.column_scale" if rescaled else None))
    elif companion and companion.follows_rows and companion.weight == "lm_head.weight" \
            and vocab.row_order is not None:
        plan.add(name, "transform", dtype, ref.shape, name, "rows reordered with lm_head's (one entry per row)",
                 Recipe("rows", name))
    elif rescaled:
        plan.add(name, "transform", dtype, ref.shape, name, "the mean pre-norm RMS (norm_output rescale)",
                 Recipe("array", array=name))
    elif dtype != ref.dtype:
        plan.add(name, "transform", dtype, ref.shape, name, f"{ref.dtype} -> {dtype}", Recipe("cast", name, dtype))
    else:
        plan.add(name, "copy", dtype, ref.shape, name, note, Recipe("bytes", name))


def _plan_vocab_maps(plan: _PlanBuilder, vocab: VocabPlan) -> None:
    """d2t and t2d as the vocabulary plan has them: copied when already right, rebuilt, added for consumers that
    read t2d, or dropped when the output has no reduced vocabulary."""
    tensors = plan.spec.tensors
    if "d2t" in tensors:
        if vocab.d2t is None:
            plan.drop("d2t", vocab.detail)
        elif vocab.d2t_from_source and tensors["d2t"].dtype == "I64":
            plan.add("d2t", "copy", "I64", (vocab.draft_vocab_size,), "d2t", "",
                     Recipe("bytes", "d2t"))
        else:
            note = "offsets of the sorted ids" if vocab.action == "sorted" else "written as int64"
            plan.add("d2t", "transform", "I64", (vocab.draft_vocab_size,), "d2t", note,
                     Recipe("array", array="d2t"))
    if vocab.t2d is not None:
        if vocab.t2d_from_source and tensors["t2d"].dtype == "BOOL":
            plan.add("t2d", "copy", "BOOL", (vocab.vocab_size,), "t2d", "", Recipe("bytes", "t2d"))
        elif "t2d" in tensors:
            plan.add("t2d", "transform", "BOOL", (vocab.vocab_size,), "t2d", "rebuilt from d2t",
                     Recipe("array", array="t2d"))
        else:
            plan.add("t2d", "add", "BOOL", (vocab.vocab_size,), None, "from d2t, for consumers that read it (P25)",
                     Recipe("array", array="t2d"))
    elif "t2d" in tensors:
        plan.drop("t2d", vocab.detail)
