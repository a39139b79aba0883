"""Everything the output must say, decided once from the source description, the options and the target.

Each decision records where it came from, so the report can say it plainly (aux ids from the source, an
argument or the engine default; norm_before_residual as written or as the source's consumer assumed).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from eaglekit.errors import CheckpointError, UsageError
from eaglekit.rules.expected import quant_companions
from eaglekit.spec import DraftSpec
from eaglekit.target import TargetInfo
from eaglekit.upgrade.dialects import writes_eagle31
from eaglekit.upgrade.encode import FLOAT_CASTABLE, is_exact_cast
from eaglekit.upgrade.options import UpgradeOptions

WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf")
FUNCTION_RANK = {"preserved": 0, "approximate": 1, "eagle3-function": 2, "warm-start": 3}
RESCALABLE_DTYPES = ("BF16", "F16", "F32", "F64", "I64", "BOOL")  # what the reference drafter runs as values


@dataclass(frozen=True)
class AuxChoice:
    ids: tuple[int, ...]  # vLLM convention (input of layer i), sorted, unique
    origin: str  # "source" | "argument" | "default"
    detail: str
    convention_known: bool
    source_ids: tuple[int, ...] | None  # what the source records, in vLLM convention (None: nothing or unknown)


@dataclass(frozen=True)
class Decisions:
    dialect: str
    attention: str
    num_aux: int  # K
    target_hidden: int  # T
    aux: AuxChoice
    vocab_size: int | None  # V
    fc_norm: bool
    fc_norm_added: bool
    fc_norm_init: str | None  # "ones" | "calibrated" when added
    norm_output: bool
    norm_output_added: bool
    norm_output_rescale: bool  # the final norm rescaled into lm_head so the fed-back state keeps EAGLE-3's scale
    norm_before_fc: bool
    norm_before_residual: bool
    norm_before_residual_origin: str
    compute_dtype: str  # dtype of fc (and of added fc_norm weights)
    cast_to: str | None  # --dtype: every float tensor is written in this dtype
    function: str  # "preserved" | "approximate" | "eagle3-function" | "warm-start" (before calibration figures)
    changes: tuple[str, ...]  # one sentence per change of function
    target: TargetInfo | None
    warnings: list[str] = field(default_factory=list)

    @property
    def calibrates(self) -> bool:
        """Whether the upgrade runs the target on calibration text: for fc_norm added with calibrated weights, or
        for the norm_output rescale where no fc_norm is added with unit weights."""
        if self.fc_norm_added:
            return self.fc_norm_init == "calibrated"
        return self.norm_output_rescale


def target_has_weights(target: TargetInfo) -> bool:
    """Weights eaglekit can run for calibration: a Hugging Face folder (a GGUF target gives its metadata only)."""
    if target.path.endswith(".gguf"):
        return False
    folder = os.path.dirname(target.path)
    return any(name.endswith(WEIGHT_SUFFIXES) for name in os.listdir(folder))


def _aux(spec: DraftSpec, opts: UpgradeOptions, target: TargetInfo | None, k: int, warnings: list[str]) -> AuxChoice:
    aux = spec.aux
    if opts.aux_convention is not None and opts.aux_layer_ids is None and (aux.location == "default"
                                                                            or aux.as_written is None):
        raise UsageError(f"--aux-convention {opts.aux_convention} without --aux-layer-ids: it says how ids are "
                         f"counted, and {spec.path} records none ({aux.source}); give --aux-layer-ids with it, or "
                         "drop --aux-convention")
    source_ids: tuple[int, ...] | None = None
    known = aux.convention_known
    detail = aux.source
    if aux.location != "default":
        if aux.ids is not None:
            source_ids = aux.ids
        if aux.as_written is not None and opts.aux_convention is not None and opts.aux_layer_ids is None:
            if aux.convention is not None and aux.convention != opts.aux_convention:
                warnings.append(f"--aux-convention {opts.aux_convention} overrides the {aux.convention}-of-layer "
                                f"convention of {spec.producer} for the recorded ids {list(aux.as_written)} (P16)")
            shift = 1 if opts.aux_convention == "output" else 0
            source_ids = tuple(i + shift for i in aux.as_written)
            known = True
            detail = (f"{aux.location}, written {list(aux.as_written)}, {opts.aux_convention}-of-layer "
                      "(--aux-convention)")
        elif aux.as_written is not None and aux.ids is None and opts.aux_layer_ids is None:
            raise UsageError(f"{spec.path}: aux layer ids {list(aux.as_written)} are recorded but their convention is "
                             "unknown (P16); pass --aux-convention input|output (or --aux-layer-ids)")

    if opts.aux_layer_ids is not None:
        shift = 1 if opts.aux_convention == "output" else 0
        ids = tuple(i + shift for i in opts.aux_layer_ids)
        conv = opts.aux_convention or "input"
        origin, detail, known = "argument", f"--aux-layer-ids {list(opts.aux_layer_ids)} ({conv}-of-layer)", True
        if source_ids is not None and tuple(sorted(source_ids)) != tuple(sorted(ids)):
            warnings.append(f"--aux-layer-ids override the ids the source records ({list(source_ids)} in vLLM "
                            f"convention)")
    elif source_ids is not None:
        ids, origin = source_ids, "source"
        if not known:
            warnings.append(f"aux layer id convention guessed by heuristic ({detail}); check with "
                            "`eaglekit verify` or pass --aux-convention (P16)")
    elif aux.location == "default" and aux.ids is not None:
        ids, origin = aux.ids, "default"
        if not known:
            warnings.append(f"aux layer ids not recorded in the source: using the engine default {list(aux.ids)} "
                            f"for the target's L={target.num_layers if target else '?'} (P17)")
    else:
        raise UsageError(f"{spec.path}: aux layer ids are not recorded in the checkpoint; pass --aux-layer-ids, or "
                         "--target to use the engine default (2, L//2, L-3)")

    if list(ids) != sorted(set(ids)):
        if len(set(ids)) != len(ids):
            raise UsageError(f"aux layer ids {list(ids)} have duplicates (P20)")
        if origin == "argument":
            raise UsageError(f"--aux-layer-ids {list(opts.aux_layer_ids or ())} are not ascending: engines "
                             "concatenate the captured states in ascending layer order, so give them ascending "
                             "(eaglekit does not permute fc's column blocks) (P20)")
        warnings.append(f"aux layer ids {list(ids)} written sorted: engines concatenate in ascending order; if the "
                        "producer concatenated in the listed order, fc's column blocks are now permuted (P20)")
        ids = tuple(sorted(ids))
    if len(ids) != k:
        raise UsageError(f"{len(ids)} aux layer ids {list(ids)} but fc takes K={k} target states (fc in-features / T)")
    if target is not None and max(ids) > target.num_layers:
        raise UsageError(f"aux layer id {max(ids)} is beyond the target's {target.num_layers} layers "
                         "(vLLM ids lie in [0, L])")
    return AuxChoice(ids, origin, detail, known, source_ids)


def _vocab_size(spec: DraftSpec, target: TargetInfo | None, warnings: list[str]) -> int | None:
    v = spec.vocab.vocab_size
    if target is None or v == target.vocab_size:
        return v
    if spec.has_embed_tokens:
        raise CheckpointError(f"draft embed_tokens has {v} rows, the target vocabulary has {target.vocab_size}",
                              spec.path)
    warnings.append(f"vocab_size {v} in the source config replaced by the target's {target.vocab_size} (P28)")
    return target.vocab_size


def _trained_flags(spec: DraftSpec, opts: UpgradeOptions, fc_norm_on: bool, warnings: list[str]
                   ) -> tuple[bool, bool, bool]:
    """(fc_norm, norm_output, norm_before_fc) as the source was trained; refuses to drop what was trained."""
    fc_norm = bool(spec.facts.fc_norm_tensor_ids)
    if spec.flags.fc_norm and not fc_norm:
        raise CheckpointError("config says fc_norm: true but there are no fc_norm.* tensors (P3: a converter dropped "
                              "the trained weights); refusing to invent them", spec.path)
    if fc_norm and not spec.flags.fc_norm:
        warnings.append("fc_norm.* tensors present while the config does not set fc_norm: the tensors win")
    if fc_norm and opts.fc_norm is False:
        raise UsageError("the source is trained with fc_norm; removing it would change the function "
                         "(drop --no-fc-norm)")
    norm_output = spec.flags.norm_output
    if spec.facts.norm_output_meaning_versioned and spec.facts.norm_output_written:
        warnings.append("SpecForge before PR #879 gave norm_output another meaning (P35): check the SpecForge "
                        "version this draft was trained with")
    if norm_output and opts.norm_output is False:
        raise UsageError("the source is trained with norm_output (post-norm feedback); removing it would change "
                         "the function (drop --no-norm-output)")
    norm_before_fc = spec.flags.norm_before_fc or "input_norm.weight" in spec.tensors
    if norm_before_fc and spec.attention == "mla":
        raise CheckpointError("norm_before_fc / input_norm is not supported by MLA drafts", spec.path)
    if fc_norm_on and not fc_norm and norm_before_fc:
        raise UsageError("the source uses norm_before_fc (one RMSNorm over the whole concatenation); it cannot be "
                         "combined with fc_norm (P37): pass --no-fc-norm")
    return fc_norm, norm_output, norm_before_fc


def _switched_on(spec: DraftSpec, opts: UpgradeOptions, target: TargetInfo | None, warnings: list[str]
                 ) -> tuple[bool, bool]:
    """(fc_norm, norm_output) to switch on (UpgradeOptions.eagle31_flags): a flag the caller leaves unset is on only
    where the target's weights let the upgrade keep the EAGLE-3 function. One left off for want of them is said so,
    with how to get EAGLE-3.1, unless the source is trained with it (then it is kept as trained)."""
    if spec.facts.parallel_drafting:
        return _parallel_drafting_flags(spec, opts, warnings)
    calibratable = target is not None and target_has_weights(target)
    fc_norm, norm_output = opts.eagle31_flags(calibratable)
    if calibratable or opts.eagle31_asked or not writes_eagle31(opts.to):
        return fc_norm, norm_output
    trained = {"fc_norm": bool(spec.facts.fc_norm_tensor_ids), "norm_output": bool(spec.flags.norm_output)}
    kept = [name for name in ("fc_norm", "norm_output") if getattr(opts, name) is None and not trained[name]]
    if kept:  # both flags are off here: nothing asked for them
        eagle3 = not any(trained.values())
        what = "kept EAGLE-3 (fc_norm, norm_output off)" if eagle3 else f"left {' and '.join(kept)} off"
        where = "--target MODEL" if target is None else f"the --target given has none eaglekit can run: {target.path}"
        anyway = "--fc-norm-init ones" if "fc_norm" in kept else "--norm-output"
        function = "the EAGLE-3 function" if eagle3 else "the source's function"
        warnings.append(f"{what}: switching {' and '.join(kept)} on without losing {function} needs the target's "
                        f"weights ({where}); {anyway} writes the untrained EAGLE-3.1 start anyway")
    return fc_norm, norm_output


def _parallel_drafting_flags(spec: DraftSpec, opts: UpgradeOptions, warnings: list[str]) -> tuple[bool, bool]:
    """A P-EAGLE draft keeps the flags it was trained with and gets none added (returned off: the trained ones are
    kept by `_trained_flags`): an added fc_norm would also renormalise mask_hidden's slots, and norm_output does
    nothing where one forward proposes every token."""
    trained = {"fc_norm": bool(spec.facts.fc_norm_tensor_ids), "norm_output": spec.flags.norm_output}
    asked = {"fc_norm": opts.fc_norm is True or opts.fc_norm_init is not None, "norm_output": opts.norm_output is True}
    added = [name for name in trained if asked[name] and not trained[name]]
    if added:
        raise UsageError(f"the source is a P-EAGLE draft (parallel drafting): switching {added[0]} on is not "
                         "supported (an added fc_norm would renormalise mask_hidden too, norm_output is never fed "
                         "back in one forward); it keeps the flags it was trained with")
    warnings.append("a P-EAGLE draft: vLLM drafts it in parallel only with \"parallel_drafting\": true in "
                    "--speculative-config (without it, it skips mask_hidden and drafts one token at a time)")
    return False, False


def _refuse_without_mask_slots(spec: DraftSpec) -> None:
    missing = [what for what, absent in (("mask_token_id", spec.facts.mask_token_id is None),
                                         ("mask_hidden", "mask_hidden" not in spec.tensors)) if absent]
    if missing:
        raise CheckpointError(f"a P-EAGLE draft without {' and '.join(missing)}: vLLM cannot draft it in parallel, "
                              "and eaglekit does not invent the mask slots", spec.path)


def _fc_norm_init(opts: UpgradeOptions, target: TargetInfo | None, added: bool, warnings: list[str]) -> str | None:
    if not added:
        if opts.fc_norm_init is not None:
            raise UsageError(f"--fc-norm-init {opts.fc_norm_init} with a source trained with fc_norm: its trained "
                             "weights are kept, so there is no fc_norm to initialise; drop --fc-norm-init")
        return None
    if opts.fc_norm_init is None:
        return "calibrated" if target is not None and target_has_weights(target) else "ones"
    if opts.fc_norm_init == "calibrated" and (target is None or not target_has_weights(target)):
        raise UsageError(f"--fc-norm-init calibrated: no weights next to {target.path if target else 'no target'}")
    return opts.fc_norm_init


def _norm_output_rescale(spec: DraftSpec, target: TargetInfo | None, added: bool, fc_norm_init: str | None
                         ) -> str | None:
    """Why switching norm_output on cannot keep the EAGLE-3 function here (None: it can, by the rescale)."""
    if not added:
        return "norm_output is not switched on"
    if target is None or not target_has_weights(target):
        return "no target weights to measure the draft's pre-norm state on"
    if fc_norm_init == "ones":
        return "fc_norm is added with unit weights, which changes the first step"
    if not spec.has_lm_head or "norm.weight" not in spec.tensors:
        return "the draft borrows the target's lm_head (or has no final norm), so there is no head to fold into"
    odd = sorted({r.dtype for r in spec.tensors.values()} - set(RESCALABLE_DTYPES))
    if odd:
        return f"the draft holds {', '.join(odd)} tensors, which the reference drafter does not run"
    if quant_companions(spec):
        return "the draft is quantised: its scales were set for the states the rescale would change"
    return None


def _norm_before_residual(spec: DraftSpec, warnings: list[str]) -> tuple[bool, str]:
    """As written; else what the source's consumer assumed (P12), said so."""
    if spec.flags.norm_before_residual is not None:
        return spec.flags.norm_before_residual, "as written in the source"
    default = spec.facts.norm_before_residual_default
    if default is None:
        return False, "not written in the source; false (vLLM flat-config default, P12)"
    if default:
        warnings.append(f"norm_before_residual written as true: {spec.producer} drafts are served with it (P12)")
    return bool(default), f"not written in the source; {spec.producer}'s consumer assumes {str(default).lower()} (P12)"


def _dtypes(spec: DraftSpec, opts: UpgradeOptions, fc_norm_added: bool) -> tuple[str, str | None]:
    """(dtype of fc and of added fc_norm weights, --dtype cast or None)."""
    cast = opts.dtype
    if cast is not None:
        if cast not in FLOAT_CASTABLE:
            raise UsageError(f"--dtype {cast}: expected bf16, fp16 or fp32")
        odd = sorted({r.dtype for r in spec.tensors.values()} - set(FLOAT_CASTABLE) - {"I64", "BOOL", "I32"})
        if odd:
            raise UsageError(f"--dtype: the draft holds {', '.join(odd)} tensors (quantised?); converting them is not "
                             "supported")
    compute = cast or spec.tensors["fc.weight"].dtype
    if compute not in FLOAT_CASTABLE and fc_norm_added:
        raise UsageError(f"fc.weight is {compute}: adding fc_norm to a quantised fc is not supported "
                         "(pass --no-fc-norm)")
    return compute, cast


def _function(spec: DraftSpec, fc_norm_init: str | None, norm_output_added: bool, norm_output_rescale: bool,
              cast: str | None, aux: AuxChoice) -> tuple[str, list[str]]:
    """preserved / approximate / eagle3-function / warm-start, with one sentence per change of the function."""
    changes: list[tuple[str, str]] = []
    if aux.source_ids is not None and list(aux.source_ids) != sorted(aux.source_ids):
        changes.append(("approximate", f"aux ids {list(aux.source_ids)} were unsorted and are written ascending: "
                                       "preserved only if the producer concatenated in layer order (P20)"))
    if fc_norm_init == "calibrated":
        changes.append(("approximate", "fc_norm added with calibrated weights: the first step's fc output "
                                       "approximates the original"))
    elif fc_norm_init == "ones":
        changes.append(("warm-start", "fc_norm added with unit weights: RMSNorm is not the identity, the first "
                                      "step changes"))
    if norm_output_added and norm_output_rescale:
        changes.append(("eagle3-function", "norm_output switched on with the final norm rescaled into lm_head: "
                                           "every step after the first is fed the EAGLE-3 state up to its "
                                           "per-token magnitude"))
    elif norm_output_added:
        changes.append(("warm-start", "norm_output switched on: every step after the first is fed the post-norm "
                                      "state"))
    if cast is not None:
        lossy = sorted({r.dtype for r in spec.tensors.values()
                        if r.dtype in FLOAT_CASTABLE and not is_exact_cast(r.dtype, cast)})
        if lossy:
            flush = "; magnitudes below 6e-8 become 0 (values beyond ±65504 are refused)" if cast == "F16" else ""
            changes.append(("approximate", f"--dtype {cast} rounds {', '.join(lossy)} weights{flush}"))
    level = max((lvl for lvl, _ in changes), key=FUNCTION_RANK.__getitem__, default="preserved")
    return level, [why for _, why in changes]


def refuse_unconvertible(spec: DraftSpec, engine: str) -> None:
    """Stop before anything is decided when the source has an error no conversion can carry (a config value of the
    wrong type or range, a quantisation tensor without a faithful place, a non-float weight, a value the output's
    engine refuses): the same findings validate reports, never a default in their place."""
    from eaglekit.rules import upgrade_refusals

    refusals = upgrade_refusals(spec, engine)
    if refusals:
        first = refusals[0]
        more = f" (and {len(refusals) - 1} more: eaglekit validate lists them)" if len(refusals) > 1 else ""
        raise CheckpointError(f"[{first.code}] {first.message}{more}; refusing to upgrade", spec.path)


def decide(spec: DraftSpec, opts: UpgradeOptions, target: TargetInfo | None) -> Decisions:
    from eaglekit.upgrade.dialects import get_dialect

    dialect = get_dialect(opts.to)

    def cannot_write(feature: str) -> None:
        if feature in dialect.CANNOT_WRITE:
            raise UsageError(f"--to {dialect.NAME}: {dialect.CANNOT_WRITE[feature]}")

    refuse_unconvertible(spec, dialect.ENGINE)
    warnings: list[str] = []
    if "fc.weight" not in spec.tensors:
        raise CheckpointError("no fc.weight: an EAGLE-1-style draft without aux hidden states cannot become "
                              "EAGLE-3/3.1", spec.path)
    if spec.facts.parallel_drafting:
        cannot_write("parallel_drafting")
        _refuse_without_mask_slots(spec)
    k = spec.num_aux_hidden_states
    t = spec.geometry.target_hidden_size
    if not k or not t:
        raise CheckpointError("cannot tell K: fc in-features are not a multiple of the target hidden size "
                              "(pass --target, or write target_hidden_size)", spec.path)
    if target is not None and t != target.hidden_size:
        raise UsageError(f"draft expects target hidden size T={t}, the target has {target.hidden_size}")
    if spec.attention in ("mla", "qwen3"):
        cannot_write(spec.attention)
    if spec.facts.fc_norm_tensor_ids or spec.flags.norm_output:
        cannot_write("eagle31")
    aux = _aux(spec, opts, target, k, warnings)
    vocab_size = _vocab_size(spec, target, warnings)
    fc_norm_on, norm_output_on = _switched_on(spec, opts, target, warnings)
    source_fc_norm, source_norm_output, norm_before_fc = _trained_flags(spec, opts, fc_norm_on, warnings)
    fc_norm_added = fc_norm_on and not source_fc_norm
    norm_output_added = norm_output_on and not source_norm_output
    init = _fc_norm_init(opts, target, fc_norm_added, warnings)
    nbr, nbr_origin = _norm_before_residual(spec, warnings)
    compute, cast = _dtypes(spec, opts, fc_norm_added)
    no_rescale = _norm_output_rescale(spec, target, norm_output_added, init)
    function, changes = _function(spec, init, norm_output_added, no_rescale is None, cast, aux)
    if function == "warm-start":
        why = f" ({no_rescale})" if norm_output_added and no_rescale else ""
        warnings.append(f"the output is a warm start for EAGLE-3.1 fine-tuning, not a trained 3.1 draft{why} (P36)")

    if spec.geometry.max_position_embeddings is None and target is None:
        warnings.append("max_position_embeddings is not in the source config: pass --target to take the target's "
                        "(engines otherwise assume their own default)")
    if nbr:
        cannot_write("norm_before_residual")
    if "eagle31" in dialect.CAVEATS and (fc_norm_on or norm_output_on or source_fc_norm or source_norm_output):
        warnings.append(dialect.CAVEATS["eagle31"])

    decisions = Decisions(
        dialect=opts.to,
        attention=spec.attention,
        num_aux=k,
        target_hidden=t,
        aux=aux,
        vocab_size=vocab_size,
        fc_norm=fc_norm_on or source_fc_norm,
        fc_norm_added=fc_norm_added,
        fc_norm_init=init,
        norm_output=norm_output_on or source_norm_output,
        norm_output_added=norm_output_added,
        norm_output_rescale=no_rescale is None,
        norm_before_fc=norm_before_fc,
        norm_before_residual=nbr,
        norm_before_residual_origin=nbr_origin,
        compute_dtype=compute,
        cast_to=cast,
        function=function,
        changes=tuple(changes),
        target=target,
        warnings=warnings,
    )
    why = dialect.refusal(spec, decisions, target)
    if why:
        raise UsageError(f"--to {dialect.NAME}: {why}")
    _refuse_unused_calibration(opts, decisions, _uncalibrated(spec, opts, decisions, no_rescale))
    return decisions


def _uncalibrated(spec: DraftSpec, opts: UpgradeOptions, d: Decisions, no_rescale: str | None) -> str:
    """Why this upgrade runs no calibration, in the options' terms."""
    if opts.fc_norm_init == "ones":
        return "--fc-norm-init ones"
    if d.target is None:
        return "no --target"
    if not target_has_weights(d.target):
        return "the --target given has no weights eaglekit can run"
    if spec.facts.fc_norm_tensor_ids:
        fc_norm = "the source's fc_norm is trained"
    elif opts.fc_norm is False:
        fc_norm = "--no-fc-norm"
    elif not writes_eagle31(opts.to):
        fc_norm = f"--to {opts.to} adds no fc_norm"
    else:
        fc_norm = "fc_norm is not added"
    if spec.flags.norm_output:
        norm_output = "its norm_output is trained"
    elif opts.norm_output is False:
        norm_output = "--no-norm-output"
    else:
        norm_output = no_rescale or "norm_output is not rescaled"
    return f"{fc_norm}; {norm_output}"


def _refuse_unused_calibration(opts: UpgradeOptions, d: Decisions, uncalibrated: str) -> None:
    """The options that set up calibration (the target's states on the calibration text) are refused where the
    upgrade calibrates nothing, and --device where a store brings the states: given there, they would do nothing.
    Decided from the options and the draft's config, before the target is run or a store read."""
    given = [flag for flag, value in (("--store", opts.store), ("--calibration-file", opts.calibration_file),
                                      ("--target-quantization", opts.target_quantization),
                                      ("--device", opts.device)) if value]
    if given and not d.calibrates:
        raise UsageError(f"{given[0]}: it sets up calibration, and this upgrade calibrates nothing ({uncalibrated}); "
                         f"drop {given[0]}")
    if opts.store and opts.device:
        raise UsageError("--device with --store: the store holds the target's states, so no target runs here; drop "
                         "--device")
