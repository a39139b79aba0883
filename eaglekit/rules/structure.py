"""Structure rules: config.json and safetensors headers only, no target, no engine, no tensor values."""

from __future__ import annotations

from eaglekit.catalogue import DOUBLE_INDEX, layer_index, reported_elsewhere
from eaglekit.config_view import int_at, nested
from eaglekit.errors import quoted
from eaglekit.io.dtypes import FLOAT_DTYPES
from eaglekit.rules.expected import (
    QUANTISED_WEIGHT_DTYPES,
    format_shape,
    quant_companions,
    quantization_config,
    shape_matches,
    tolerated_extra,
    unscaled_weights,
)
from eaglekit.rules.facts import (
    examples,
    fmt_ids,
    layer_config,
    layer_key,
    names_in_source,
    written_id_lists,
)
from eaglekit.rules.registry import Hit, RuleContext, rule
from eaglekit.spec import aux_count

# ---------------------------------------------------------------- layers and the expected tensor set


def _empty_layers(ctx: RuleContext) -> list[int]:
    present = set(ctx.spec.facts.tensor_layer_ids)
    return [i for i in range(ctx.spec.geometry.num_layers) if present and i not in present]


def _megatron_slot(ctx: RuleContext, name: str) -> bool:
    i = layer_index(name)
    return (i is not None and i >= 1 and name == f"layers.{i}.input_layernorm.weight"
            and f"layers.{i}.hidden_norm.weight" in ctx.spec.tensors)


@rule("EK101", "error", "structure", "P49", "config layer count disagrees with the tensors",
      fix="write num_hidden_layers as the number of layers the tensors hold (the finding names it)")
def layer_count(ctx: RuleContext):
    spec = ctx.spec
    written = spec.facts.config_num_layers
    if not spec.facts.tensor_layer_ids:
        return
    held = spec.geometry.num_layers  # highest layer index + 1: gaps are EK102's
    key = layer_key(spec, "num_hidden_layers")
    if written is None:
        yield Hit(f"{key} is not written (HF defaults it to 32); the tensors hold {held} layer(s): write {held}",
                  key=key)
    elif written != held:
        effect = ("vLLM builds the extra layers and leaves them uninitialised" if written > held
                  else "the extra layers' tensors are unknown names to vLLM")
        yield Hit(f"{key} is {written} but the tensors hold {held} layer(s): {effect}; set it to {held}", key=key)


@rule("EK102", "error", "structure", "P2", "a draft layer has no tensors at all",
      fix="re-export the missing layer from the training checkpoint, or renumber the layers the export holds")
def layer_gaps(ctx: RuleContext):
    present = sorted(set(ctx.spec.facts.tensor_layer_ids))
    for i in _empty_layers(ctx):
        yield Hit(f"layer {i} has no tensors (layers {present} do): a truncated or mis-renamed multi-layer export")


@rule("EK103", "error", "structure", "P5", "a tensor the architecture needs is missing",
      fix="re-export the missing tensor from the training checkpoint")
def missing_tensors(ctx: RuleContext):
    empty = set(_empty_layers(ctx))
    for e in ctx.expectations:
        if not e.required or e.name in ctx.spec.tensors or reported_elsewhere(e.name):
            continue
        if layer_index(e.name) in empty or _megatron_slot(ctx, e.name):
            continue
        yield Hit(f"{e.name} {format_shape(e.shape)} is missing ({e.why}); engines do not notice and run with "
                  "uninitialised weights: re-export it from the training checkpoint", tensor=e.name)


@rule("EK104", "error", "structure", "P30", "a tensor that is not part of the declared architecture",
      fix="rename the tensor to its place in the architecture, or remove it")
def unexpected_tensors(ctx: RuleContext):
    spec = ctx.spec
    expected = {e.name for e in ctx.expectations}
    for name, ref in spec.tensors.items():
        if name in expected or reported_elsewhere(name) or DOUBLE_INDEX.match(name) or tolerated_extra(spec, name):
            continue
        if ref.source_name.startswith("draft_model."):
            continue
        yield Hit(f"{ref.source_name} is not part of this draft's architecture ({spec.attention}, "
                  f"{spec.geometry.num_layers} layer(s)): vLLM fails on unknown names and SGLang drops them; "
                  "rename or remove it", tensor=name)


@rule("EK105", "error", "structure", "P43", "a tensor's shape disagrees with the geometry",
      fix="write the geometry the weights were trained with (heads, head_dim, sizes) in config.json")
def tensor_shapes(ctx: RuleContext):
    spec = ctx.spec
    quantised = quantization_config(spec) is not None
    fc_in = spec.facts.fc_in_features
    T = spec.geometry.target_hidden
    for e in ctx.expectations:
        ref = spec.tensors.get(e.name)
        if ref is None or shape_matches(ref.shape, e.shape):
            continue
        if quantised and ref.dtype in ("U8", "I8"):
            continue  # packed quantised weights have their own shapes
        if e.name == "fc.weight" and fc_in and fc_in % T:
            continue  # EK120 names the cause
        yield Hit(f"{e.name} is {list(ref.shape)}, expected {format_shape(e.shape)} ({e.why}); the config's "
                  "geometry (heads, head_dim, sizes) does not describe these weights", tensor=e.name)


@rule("EK106", "error", "structure", "P24", "a tensor has the wrong dtype",
      fix="re-export the tensor in the dtype the finding names (d2t: int64 offsets; t2d: a bool mask)")
def tensor_dtypes(ctx: RuleContext):
    spec = ctx.spec
    for e in ctx.expectations:
        ref = spec.tensors.get(e.name)
        if ref is None:
            continue
        if e.kind == "int64" and ref.dtype != "I64":
            yield Hit(f"{e.name} is {ref.dtype}; vLLM and SGLang expect int64 offsets", tensor=e.name)
        elif e.kind == "bool" and ref.dtype != "BOOL":
            yield Hit(f"{e.name} is {ref.dtype}; expected a bool mask", tensor=e.name)


@rule("EK159", "error", "structure", "P24", "a weight tensor that holds no floating-point values",
      refuses_upgrade=True,
      fix=("re-export the weight as floating-point values, or, quantised, with its quantization_config and scales; "
           "upgrade refuses the source until then"))
def weight_dtypes(ctx: RuleContext):
    spec = ctx.spec
    quantised = quantization_config(spec) is not None
    for e in ctx.expectations:
        ref = spec.tensors.get(e.name)
        if ref is None or e.kind != "float" or ref.dtype in FLOAT_DTYPES:
            continue
        if quantised and ref.dtype in QUANTISED_WEIGHT_DTYPES:
            continue  # int8 / packed 4-bit weights with their scales (EK158 judges those)
        allowed = f"; a quantised draft may hold {', '.join(QUANTISED_WEIGHT_DTYPES)} weights" if quantised else ""
        yield Hit(f"{e.name} is {ref.dtype}, not a floating-point weight (engines cannot compute with it{allowed})",
                  tensor=e.name)


@rule("EK158", "error", "structure", None, "a quantisation tensor no conversion can carry", refuses_upgrade=True,
      fix="write the weights unquantised (from the training checkpoint), or serve the quantised draft as it is")
def quantisation_tensors(ctx: RuleContext):
    for c in quant_companions(ctx.spec):
        if c.problem:
            yield Hit(c.problem, tensor=c.name)


@rule("EK160", "error", "structure", None, "a quantised weight without its weight_scale", refuses_upgrade=True,
      fix="export each quantised weight's weight_scale with it, or write the weight unquantised")
def unscaled_quantised_weights(ctx: RuleContext):
    qcfg = quantization_config(ctx.spec) or {}
    for name in unscaled_weights(ctx.spec):
        scale = f"{name.removesuffix('.weight')}.weight_scale"
        yield Hit(f"{name} is {ctx.spec.tensors[name].dtype} but there is no {scale}: vLLM's "
                  f"{quoted(qcfg.get('quant_method'))} linear method creates that scale parameter for the layer and "
                  "nothing loads it (fp8 leaves it at float32's lowest value), so every output of the layer is "
                  "garbage; export the scale with the weight, or write the weight unquantised", tensor=name)


@rule("EK107", "error", "structure", "P32", "a layer >= 1 keeps its input norm under hidden_norm",
      fix="rename layers.{i}.hidden_norm.weight to layers.{i}.input_layernorm.weight (`eaglekit upgrade` does)")
def megatron_hidden_norm(ctx: RuleContext):
    for name in sorted(ctx.spec.tensors):
        i = layer_index(name)
        input_norm = f"layers.{i}.input_layernorm.weight"
        if i and name == f"layers.{i}.hidden_norm.weight" and input_norm not in ctx.spec.tensors:
            yield Hit(f"{name} with no layers.{i}.input_layernorm.weight: a ModelOpt Megatron export; vLLM would "
                      f"keep layer {i}'s input norm at 1.0: rename it to {input_norm}", tensor=name)


@rule("EK108", "error", "structure", "P2", "doubly indexed layer names (layers.i.j.)",
      fix="convert again from the original multi-layer checkpoint, not from speculators convert's output")
def double_indexed(ctx: RuleContext):
    names = names_in_source(ctx.spec, lambda n: bool(DOUBLE_INDEX.match(n.removeprefix("model."))))
    if names:
        yield Hit(f"{len(names)} tensor(s) named layers.i.j. ({examples(names)}): the trace of a multi-layer draft "
                  "pushed through speculators convert, whose saved layers are random; convert from the original")


@rule("EK109", "error", "structure", "P30", "training-state prefix draft_model.",
      fix="run the producer's export step on the training state and use what it writes")
def draft_model_prefix(ctx: RuleContext):
    names = names_in_source(ctx.spec, lambda n: n.startswith("draft_model."))
    if names:
        yield Hit(f"{len(names)} tensor(s) carry the SpecForge training prefix draft_model. ({examples(names)}): "
                  "this is a training state, not an export; run the producer's export step")


# ---------------------------------------------------------------- norm flags and their tensors


@rule("EK110", "error", "structure", "P3", "fc_norm: true without its K fc_norm tensors",
      fix=("restore the K fc_norm.{k}.weight tensors from the training checkpoint, or write fc_norm: false if the "
           "draft was trained without them"))
def fc_norm_missing(ctx: RuleContext):
    spec = ctx.spec
    if not spec.flags.fc_norm:
        return
    K = spec.num_aux_hidden_states or 0
    have = set(spec.facts.fc_norm_tensor_ids)
    missing = [k for k in range(K) if k not in have]
    extra = sorted(k for k in have if k >= K)
    if missing:
        names = ", ".join(f"fc_norm.{k}.weight" for k in missing)
        yield Hit(f"fc_norm is true but {names} missing: vLLM keeps all-ones norms without a message; restore the "
                  "trained weights", key="fc_norm")
    if extra:
        yield Hit(f"fc_norm.{extra[0]}.weight and up exceed K={K} aux states: the fc_norm count must equal K",
                  tensor=f"fc_norm.{extra[0]}.weight")


@rule("EK111", "error", "structure", "P3", "fc_norm tensors while fc_norm is not true", refuses_load=True,
      fix="write fc_norm: true if the draft was trained with the norms; otherwise remove the fc_norm tensors")
def fc_norm_unflagged(ctx: RuleContext):
    spec = ctx.spec
    ids = spec.facts.fc_norm_tensor_ids
    if ids and not spec.flags.fc_norm:
        yield Hit(f"{len(ids)} fc_norm.*.weight tensor(s) but fc_norm is not true: vLLM rejects them as unknown "
                  "names and SGLang silently skips them; write fc_norm: true", key="fc_norm")


@rule("EK112", "error", "structure", "P8", "norm_before_fc: true without input_norm.weight",
      fix=("restore input_norm.weight from the training checkpoint, or write norm_before_fc: false if the draft was "
           "trained without it"))
def input_norm_missing(ctx: RuleContext):
    if ctx.spec.flags.norm_before_fc and "input_norm.weight" not in ctx.spec.tensors:
        yield Hit("norm_before_fc is true but input_norm.weight is missing: the engine keeps an all-ones norm",
                  key="norm_before_fc")


@rule("EK113", "error", "structure", "P8", "input_norm.weight while norm_before_fc is not true",
      fix="write norm_before_fc: true")
def input_norm_unflagged(ctx: RuleContext):
    if "input_norm.weight" in ctx.spec.tensors and not ctx.spec.flags.norm_before_fc:
        yield Hit("input_norm.weight is present but norm_before_fc is not true: vLLM drops it silently and serves "
                  "without the norm; write norm_before_fc: true", tensor="input_norm.weight")


@rule("EK114", "error", "structure", "P37", "norm_before_fc and fc_norm together",
      fix="keep the flag the draft was trained with; write the other false and remove its tensors")
def both_fc_norms(ctx: RuleContext):
    if ctx.spec.flags.norm_before_fc and ctx.spec.flags.fc_norm:
        yield Hit("norm_before_fc and fc_norm are both true: speculators forbids the pair and no trainer produces "
                  "it; keep the one the draft was trained with", key="norm_before_fc")


@rule("EK115", "info", "structure", "P37", "norm_before_fc is not EAGLE-3.1",
      fix="nothing to fix: it serves as norm_before_fc and cannot be reshaped into EAGLE-3.1's fc_norm")
def norm_before_fc_note(ctx: RuleContext):
    if "input_norm.weight" in ctx.spec.tensors and ctx.spec.flags.norm_before_fc and not ctx.spec.flags.fc_norm:
        yield Hit("input_norm.weight is one RMSNorm over the whole K·T concatenation (norm_before_fc), not "
                  "EAGLE-3.1's per-state fc_norm; it cannot be reshaped into fc_norm", tensor="input_norm.weight")


@rule("EK116", "error", "structure", "P31", "norm_before_fc in an MLA draft",
      fix=("remove norm_before_fc and input_norm.weight, or retrain without them: the MLA eagle3 class has no input "
           "norm"))
def mla_input_norm(ctx: RuleContext):
    spec = ctx.spec
    if spec.attention == "mla" and (spec.flags.norm_before_fc or "input_norm.weight" in spec.tensors):
        yield Hit("MLA draft with norm_before_fc / input_norm.weight: the DeepSeek eagle3 class has no input_norm "
                  "(unknown name in vLLM)", key="norm_before_fc")


# ---------------------------------------------------------------- fc, K and T


@rule("EK120", "error", "structure", "P11", "fc in-features are not a multiple of T",
      fix="write the target_hidden_size the draft was trained for, or re-export fc.weight")
def fc_width(ctx: RuleContext):
    spec = ctx.spec
    fc_in = spec.facts.fc_in_features
    T = spec.geometry.target_hidden
    if fc_in and fc_in % T:
        yield Hit(f"fc.weight has {fc_in} in-features, not K·T for T={T} (target_hidden_size): either T or the fc "
                  "weight is wrong", tensor="fc.weight")


@rule("EK121", "error", "structure", "P11", "num_aux_hidden_states disagrees with fc",
      fix="write num_aux_hidden_states as the K that fc.weight holds (the finding names it)")
def k_written(ctx: RuleContext):
    spec = ctx.spec
    written = spec.facts.config_num_aux_hidden_states
    fc_in = spec.facts.fc_in_features
    T = spec.geometry.target_hidden
    K = aux_count(fc_in, T)
    if written is not None and K is not None and written != K:
        yield Hit(f"num_aux_hidden_states is {written} but fc.weight holds K={K} (in-features {fc_in} / "
                  f"T={T}): set it to {K}", key="num_aux_hidden_states")


@rule("EK122", "error", "structure", "P11", "an aux-id list's length disagrees with K",
      fix="write the K distinct aux layer ids the draft was trained on")
def ids_count(ctx: RuleContext):
    K = ctx.spec.num_aux_hidden_states
    if not K or not ctx.spec.facts.fc_in_features:
        return
    for key, ids in written_id_lists(ctx.spec):
        if len(set(ids)) != K:
            yield Hit(f"{key} lists {len(set(ids))} distinct layer(s) {fmt_ids(ids)} but fc.weight expects K={K} "
                      "aux states: the capture count must equal K", key=key)


@rule("EK123", "error", "structure", "P26", "target_hidden_size missing or wrong",
      fix="write target_hidden_size as the width of the fc_norm tensors (the target's hidden size)")
def target_hidden_size(ctx: RuleContext):
    spec = ctx.spec
    H = spec.geometry.hidden_size
    written = spec.config.get("target_hidden_size")
    widths = {spec.tensors[f"fc_norm.{k}.weight"].shape for k in spec.facts.fc_norm_tensor_ids}
    width = next(iter(widths))[0] if len(widths) == 1 and len(next(iter(widths))) == 1 else None
    if width is None:
        return
    if written is None and width != H:
        yield Hit(f"fc_norm width T={width} differs from hidden_size H={H} but target_hidden_size is not written: "
                  f"engines build fc and fc_norm for T=H; write target_hidden_size: {width}", key="target_hidden_size")
    elif isinstance(written, int) and written != width:
        yield Hit(f"target_hidden_size is {written} but the fc_norm tensors are {width} wide", key="target_hidden_size")


@rule("EK124", "error", "structure", "P26", "T != H without the draft's own embed_tokens",
      fix="ship the draft's own embed_tokens.weight [V, H] from the training checkpoint")
def embed_needed(ctx: RuleContext):
    spec = ctx.spec
    H, T = spec.geometry.hidden_size, spec.geometry.target_hidden
    if T != H and not spec.has_embed_tokens:
        yield Hit(f"target hidden size T={T} differs from the draft's H={H}, so the target's [V, {T}] embedding "
                  f"cannot be shared: ship embed_tokens.weight [V, {H}]", tensor="embed_tokens.weight")


@rule("EK125", "error", "structure", "P43", "a config size disagrees with the tensors",
      fix="write the size the tensors hold (the finding names it)")
def config_sizes(ctx: RuleContext):
    spec = ctx.spec
    lcfg = layer_config(spec)
    g = spec.geometry
    checks: list[tuple[str, int | None]] = [("hidden_size", g.hidden_size), ("intermediate_size", g.intermediate_size)]
    if g.mla is not None:
        checks += [("q_lora_rank", g.mla.q_lora_rank), ("kv_lora_rank", g.mla.kv_lora_rank)]
    for key, actual in checks:
        written = int_at(lcfg, key)
        if written is not None and actual and written != actual:
            yield Hit(f"{layer_key(spec, key)} is {written} but the tensors say {actual}", key=layer_key(spec, key))


# ---------------------------------------------------------------- vocabulary


@rule("EK130", "error", "structure", "P4", "reduced draft vocabulary without d2t",
      fix="restore d2t from the training checkpoint")
def d2t_missing(ctx: RuleContext):
    v = ctx.spec.vocab
    if v.vocab_size is not None and v.draft_vocab_size < v.vocab_size and not v.has_d2t:
        yield Hit(f"draft vocabulary Vd={v.draft_vocab_size} < V={v.vocab_size} but there is no d2t: draft ids map to "
                  "the wrong target tokens (acceptance ~0); restore d2t from the source checkpoint", tensor="d2t")


@rule("EK131", "error", "structure", "P28", "vocabulary sizes disagree",
      fix="write vocab_size as the target's vocabulary and draft_vocab_size as the rows of lm_head.weight")
def vocab_sizes(ctx: RuleContext):
    spec = ctx.spec
    Vd, V = spec.vocab.draft_vocab_size, spec.vocab.vocab_size
    written_vd, written_v = spec.facts.config_draft_vocab_size, spec.facts.config_vocab_size
    if spec.has_lm_head and written_vd is not None and written_vd != Vd:
        yield Hit(f"draft_vocab_size is {written_vd} but lm_head.weight has {Vd} rows", key="draft_vocab_size")
    if spec.has_embed_tokens and written_v is not None and written_v != spec.tensors["embed_tokens.weight"].shape[0]:
        yield Hit(f"vocab_size is {written_v} but embed_tokens.weight has "
                  f"{spec.tensors['embed_tokens.weight'].shape[0]} rows", key="vocab_size")
    if V is not None and Vd > V:
        yield Hit(f"draft vocabulary Vd={Vd} exceeds the vocabulary V={V}: vocab_size must be the target's",
                  key="vocab_size")


@rule("EK132", "error", "structure", "P5", "no lm_head although Vd != V",
      fix="restore lm_head.weight from the training checkpoint")
def lm_head_missing(ctx: RuleContext):
    v = ctx.spec.vocab
    if not ctx.spec.has_lm_head and v.vocab_size is not None and v.draft_vocab_size != v.vocab_size:
        yield Hit(f"lm_head.weight is missing and Vd={v.draft_vocab_size} != V={v.vocab_size}: the target's head "
                  "cannot stand in; engines run with a random head", tensor="lm_head.weight")


@rule("EK133", "info", "structure", "P5", "no lm_head: the target's head is used",
      fix="nothing to fix: the model card should say the target's head is shared")
def lm_head_shared(ctx: RuleContext):
    v = ctx.spec.vocab
    if not ctx.spec.has_lm_head and v.vocab_size is not None and v.draft_vocab_size == v.vocab_size:
        yield Hit("no lm_head.weight: vLLM shares the target's head (valid because Vd == V); the model card should "
                  "say so", tensor="lm_head.weight")


def _tied(ctx: RuleContext) -> bool:
    return bool(ctx.spec.config.get("tie_word_embeddings", layer_config(ctx.spec).get("tie_word_embeddings", False)))


@rule("EK134", "error", "structure", "P28", "tie_word_embeddings with a reduced vocabulary",
      fix="write tie_word_embeddings: false")
def tied_reduced(ctx: RuleContext):
    v = ctx.spec.vocab
    if _tied(ctx) and v.vocab_size is not None and v.draft_vocab_size < v.vocab_size:
        yield Hit(f"tie_word_embeddings is true but the head has Vd={v.draft_vocab_size} rows and the embedding "
                  f"V={v.vocab_size}: impossible to tie; write tie_word_embeddings: false", key="tie_word_embeddings")


@rule("EK135", "warning", "structure", "P28", "tie_word_embeddings inherited from a tied target",
      fix="write tie_word_embeddings: false")
def tied_full(ctx: RuleContext):
    v = ctx.spec.vocab
    if _tied(ctx) and (v.vocab_size is None or v.draft_vocab_size >= v.vocab_size):
        yield Hit("tie_word_embeddings is true: drafts are never tied (SGLang's set_embed_and_head crashes on it); "
                  "write tie_word_embeddings: false", key="tie_word_embeddings")


@rule("EK136", "info", "structure", "P25", "d2t without t2d",
      fix="export t2d beside d2t where SpecForge, speculators convert or executorch read the draft")
def d2t_without_t2d(ctx: RuleContext):
    v = ctx.spec.vocab
    if v.has_d2t and not v.has_t2d and v.vocab_size is not None and v.draft_vocab_size < v.vocab_size:
        yield Hit("d2t without t2d: vLLM and SGLang need only d2t, but SpecForge, speculators convert and executorch "
                  "require t2d too (speculators convert drops d2t without it)", tensor="t2d")


@rule("EK137", "warning", "structure", "P7", "TorchSpec vocabulary pruning",
      fix=("measure it with `eaglekit verify`; where acceptance is low, slice lm_head again by the target ids from the"
           " training checkpoint"))
def torchspec_pruning(ctx: RuleContext):
    spec = ctx.spec
    marker = "torchspec_version" in spec.metadata or "_torchspec_version" in spec.config
    if marker and spec.vocab.has_d2t:
        yield Hit("TorchSpec export with a pruned vocabulary (d2t): its convert_to_hf sliced lm_head with the offsets "
                  "instead of the target ids, so rows may score the wrong tokens; check with eaglekit verify",
                  tensor="lm_head.weight")


# ---------------------------------------------------------------- aux layer ids


@rule("EK140", "error", "structure", "P20", "duplicate aux layer ids",
      fix="write each aux layer id once: the layers the draft was trained on")
def duplicate_ids(ctx: RuleContext):
    for key, ids in written_id_lists(ctx.spec):
        if len(set(ids)) != len(ids):
            yield Hit(f"{key} {fmt_ids(ids)} repeats a layer: vLLM captures sorted(set(ids)), fewer states than listed",
                      key=key)


@rule("EK141", "warning", "structure", "P20", "aux layer ids not in ascending order",
      fix=("write the aux layer ids ascending; if the producer concatenated in listed order, permute fc's column "
           "blocks to match"))
def unsorted_ids(ctx: RuleContext):
    for key, ids in written_id_lists(ctx.spec):
        if len(set(ids)) == len(ids) and ids != sorted(ids):
            yield Hit(f"{key} {fmt_ids(ids)} is not ascending: engines concatenate in ascending order, so a producer "
                      "that used listed order had its fc column blocks permuted", key=key)


@rule("EK142", "warning", "structure", "P16", "aux id convention unknown",
      fix="find the convention with `eaglekit verify --diagnose` (aux ids +-1) and write the ids in vLLM convention")
def convention_unknown(ctx: RuleContext):
    aux = ctx.spec.aux
    if aux.as_written is not None and aux.convention is None:
        yield Hit(f"aux ids {fmt_ids(aux.as_written)} ({aux.location}) from an unknown producer: cannot tell "
                  "input-of-layer from output-of-layer (off by one either way); eaglekit verify can sweep both")


@rule("EK143", "warning", "structure", "P16", "aux id convention guessed",
      fix="confirm the convention with `eaglekit verify --diagnose`, which scores the ids +-1")
def convention_guessed(ctx: RuleContext):
    aux = ctx.spec.aux
    if aux.as_written is not None and aux.convention is not None and not aux.convention_known:
        yield Hit(f"aux ids {fmt_ids(aux.as_written)} read as {aux.convention}-of-layer, a guess ({aux.source}); "
                  f"vLLM ids {fmt_ids(aux.ids or ())}; confirm with eaglekit verify")


@rule("EK144", "warning", "structure", "P46", "input-of-layer layout whose first aux id is 1",
      fix="check the ids against the training run: output-of-layer ids copied here need +1")
def input_ids_look_shifted(ctx: RuleContext):
    aux = ctx.spec.aux
    if aux.convention_known and aux.convention == "input" and aux.as_written and aux.as_written[0] == 1:
        yield Hit(f"aux ids {fmt_ids(aux.as_written)} start at 1, the output-of-layer signature, in a layout whose "
                  "ids are input-of-layer: copied without the +1 shift?")


@rule("EK145", "warning", "structure", "P47", "output-of-layer producer whose first aux id is 2",
      fix="check the ids against the training run: ids that were already shifted must not be shifted again")
def output_ids_look_shifted(ctx: RuleContext):
    aux = ctx.spec.aux
    if aux.convention_known and aux.convention == "output" and aux.as_written and aux.as_written[0] == 2:
        yield Hit(f"aux ids {fmt_ids(aux.as_written)} from an output-of-layer producer start at 2, the "
                  f"input-of-layer signature: if already shifted, the +1 makes them {fmt_ids(aux.ids or ())}, one too "
                  "late")


@rule("EK146", "warning", "structure", "P19", "top-level and eagle_config aux ids differ",
      fix="write the ids the draft was trained on in both places, each in the convention its reader takes")
def ids_disagree(ctx: RuleContext):
    lists = dict(written_id_lists(ctx.spec))
    top = lists.get("eagle_aux_hidden_state_layer_ids")
    nested = lists.get("eagle_config.eagle_aux_hidden_state_layer_ids")
    if top is None or nested is None or top == nested:
        return
    if top == [i + 1 for i in nested]:
        return  # reference §5.5: vLLM ids top-level, SGLang's output-of-layer ids in eagle_config
    yield Hit(f"top-level ids {fmt_ids(top)} and eagle_config ids {fmt_ids(nested)} differ: vLLM captures the first, "
              "SGLang and vLLM's K the second", key="eagle_config.eagle_aux_hidden_state_layer_ids")


# ---------------------------------------------------------------- semantics flags


@rule("EK150", "warning", "structure", "P12", "speculators layout without norm_before_residual",
      fix="write norm_before_residual with the value the draft was trained with")
def nbr_speculators(ctx: RuleContext):
    spec = ctx.spec
    if spec.config_layout == "speculators" and "norm_before_residual" not in spec.config:
        yield Hit("norm_before_residual is not written: vLLM's speculators path assumes true, SGLang and llama.cpp "
                  "false, speculators convert writes false and train true; write the value the draft was trained with",
                  key="norm_before_residual")


@rule("EK151", "info", "structure", "P12", "flat layout without norm_before_residual",
      fix="write norm_before_residual explicitly (`eaglekit upgrade` does)")
def nbr_flat(ctx: RuleContext):
    spec = ctx.spec
    if spec.config_layout == "flat" and "norm_before_residual" not in spec.config:
        yield Hit("norm_before_residual is not written: vLLM (flat), SGLang and llama.cpp assume false; a "
                  "vLLM-ready config writes it explicitly", key="norm_before_residual")


@rule("EK152", "warning", "structure", "P12", "norm_before_residual forced true by ModelOpt convert_to_vllm_ckpt",
      fix=("write the norm_before_residual the draft was trained with (ModelOpt: usually false); `eaglekit verify "
           "--diagnose` scores both"))
def nbr_forced(ctx: RuleContext):
    spec = ctx.spec
    if spec.facts.norm_before_residual_forced and spec.config.get("norm_before_residual") is True:
        yield Hit("norm_before_residual: true was hard-coded by ModelOpt's convert_to_vllm_ckpt.py, not taken from "
                  "training; ModelOpt drafts are usually trained with false: confirm with eaglekit verify",
                  key="norm_before_residual")


@rule("EK153", "warning", "structure", "P35", "SpecForge norm_output whose meaning depends on the SpecForge version",
      fix="confirm the SpecForge version the draft was trained with, or score both with `eaglekit verify --diagnose`")
def specforge_norm_output(ctx: RuleContext):
    spec = ctx.spec
    if spec.facts.norm_output_meaning_versioned and "norm_output" in spec.config:
        meaning = ("before PR #879 this meant EAGLE-3 recurrence (norm before lm_head only)" if spec.flags.norm_output
                   else "before PR #879 this meant no final norm at all")
        yield Hit(f"SpecForge draft with norm_output: {str(spec.flags.norm_output).lower()}; {meaning}, but vLLM and "
                  "SGLang read the post-PR meaning: confirm the SpecForge version or sweep with eaglekit verify",
                  key="norm_output")


@rule("EK154", "info", "structure", "P33", "sliding-window draft attention",
      fix="keep the sliding-window keys through any conversion and measure acceptance with `eaglekit verify`")
def sliding_window(ctx: RuleContext):
    lcfg = layer_config(ctx.spec)
    types = lcfg.get("layer_types")
    sliding = isinstance(types, list) and any("sliding" in str(t) for t in types)
    if sliding or ctx.spec.geometry.sliding_window:
        window = ctx.spec.geometry.sliding_window or lcfg.get("sliding_window")
        yield Hit(f"draft layers use sliding-window attention (window {window}): whether an engine honours it for "
                  "the draft is not established; keep the keys through any conversion", key="layer_types")


@rule("EK155", "info", "structure", "P40", "rope_theta not written",
      fix="write rope_theta explicitly: 10000 if the draft was trained with EAGLE's default")
def rope_theta(ctx: RuleContext):
    lcfg = layer_config(ctx.spec)
    params = nested(lcfg, "rope_parameters")
    if "rope_theta" not in lcfg and "rope_theta" not in params:
        yield Hit("rope_theta is not written: EAGLE's implicit 10000 applies; write it explicitly",
                  key=layer_key(ctx.spec, "rope_theta"))


@rule("EK156", "warning", "structure", "P36", "an upgrade's warm start that was never fine-tuned",
      fix="fine-tune it against its target with `eaglekit finetune` before serving or pushing it")
def untrained_warm_start(ctx: RuleContext):
    from eaglekit.provenance import untrained_warm_start

    summary = untrained_warm_start(ctx.spec.config)
    if summary:
        yield Hit(f"eaglekit upgrade changed the function without training ({summary}): it accepts fewer "
                  "tokens than its source until trained; fine-tune it against its target with `eaglekit finetune`",
                  key="eaglekit")


@rule("EK157", "error", "structure", None, "config value of the wrong type or range", refuses_upgrade=True,
      fix="write the value with the type and range the finding names")
def config_value_types(ctx: RuleContext):
    for problem in ctx.spec.facts.config_problems:
        yield Hit(f"{problem.message}; engines misread or refuse it", key=problem.key)
