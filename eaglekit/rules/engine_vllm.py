"""vLLM rules: how the eagle3 loader and runners of a given vLLM version read this draft (reference §3.3, §4, §11)."""

from __future__ import annotations

import re
import shlex

from eaglekit.catalogue import carried
from eaglekit.config_view import REPO_ID, as_ids, nested
from eaglekit.engines.base import TOP_IDS, format_version, parse_version, target_folder
from eaglekit.engines.vllm import (
    CLASS_ATTENTION,
    EAGLE3_NORM_BEFORE_RESIDUAL_DEFAULT,
    PEAGLE_NORM_BEFORE_RESIDUAL_DEFAULT,
    RECORD,
    VLLM,
    VLLM_ACCEPTS,
    VLLM_D2T_OPTIONAL,
    VLLM_OLDEST_KNOWN,
    VLLM_QWEN3_MASK_HIDDEN,
    vllm_default_runner,
    vllm_requirements,
)
from eaglekit.errors import MAX_QUOTED_CHARS, quoted
from eaglekit.families.names import legacy_pattern
from eaglekit.rules.expected import tolerated_extra
from eaglekit.rules.facts import (
    eagle_config,
    examples,
    fmt_ids,
    layer_config,
    layer_key,
    names_in_source,
)
from eaglekit.rules.registry import Hit, RuleContext, rule

_MIDLAYER_MULTI = re.compile(r"^(model\.)?midlayer\.\d+\.")
_LEGACY = legacy_pattern("vllm")


def _v(ctx: RuleContext) -> str:
    return f"vLLM {format_version(ctx.checked_version)}"


def _default_ids(ctx: RuleContext) -> str:
    if ctx.target is not None:
        return f"{fmt_ids(ctx.target.default_aux_ids)} for L={ctx.target.num_layers}"
    return "(2, L//2, L-3)"


@rule("EK301", "error", "engine", "P14", "architecture vLLM cannot load", engine=VLLM, refuses_load=True)
def architecture(ctx: RuleContext):
    if ctx.vllm.problem:
        yield Hit(f"{ctx.vllm.problem}; use LlamaForCausalLMEagle3, Eagle3Qwen3ForCausalLM or "
                  "Eagle3DeepseekV2ForCausalLM", key="architectures")


@rule("EK302", "error", "engine", "P29", "model. prefix on tensor names", engine=VLLM, refuses_load=True)
def model_prefix(ctx: RuleContext):
    names = names_in_source(ctx.spec, lambda n: n.startswith("model."))
    if names:
        yield Hit(f"{len(names)} tensor name(s) start with model. ({examples(names)}): vLLM adds the prefix itself "
                  "and fails on model.model.*; strip it")


@rule("EK303", "error", "engine", "P2", "midlayer.{i}. names of a multi-layer export", engine=VLLM, refuses_load=True)
def midlayer_multi(ctx: RuleContext):
    names = names_in_source(ctx.spec, lambda n: bool(_MIDLAYER_MULTI.match(n)))
    if names:
        yield Hit(f"{len(names)} tensor(s) named midlayer.{{i}}. ({examples(names)}): vLLM's midlayer. -> layers.0. "
                  "rename makes them layers.0.{i}., unknown names; rename to layers.{i}.")


@rule("EK304", "error", "engine", "P30", "legacy tensor names", engine=VLLM, refuses_load=True)
def legacy_names(ctx: RuleContext):
    names = names_in_source(ctx.spec, lambda n: bool(_LEGACY.search(n)))
    if names:
        yield Hit(f"{len(names)} legacy tensor name(s) ({examples(names)}): unknown names to vLLM; rename to "
                  "fc_norm.{k}, fc, hidden_norm, norm")


@rule("EK305", "error", "engine", "P32", "Megatron hidden_norm names in layers >= 1", engine=VLLM)
def megatron_names(ctx: RuleContext):
    layers = ctx.spec.facts.renamed_hidden_norm_layers
    if layers:
        yield Hit(f"layer(s) {fmt_ids(layers)} store their input norm as hidden_norm (ModelOpt Megatron): vLLM loads "
                  "it into the unused hidden_norm and keeps input_layernorm at 1.0; rename on upgrade")


def _d2t_with_full_vocab(spec) -> bool:
    v = spec.vocab
    return v.has_d2t and v.vocab_size is not None and v.draft_vocab_size == v.vocab_size


@rule("EK306", "error", "engine", "P23", "d2t although Vd == V (vLLM >= 0.30)", engine=VLLM, refuses_load=True)
def d2t_with_full_vocab(ctx: RuleContext):
    if _d2t_with_full_vocab(ctx.spec) and ctx.checked_version >= VLLM_D2T_OPTIONAL:
        yield Hit(f"d2t is present but Vd == V: {_v(ctx)} has no draft_id_to_target_id parameter then and fails on "
                  "the unknown name; drop d2t (and t2d)", tensor="d2t")


@rule("EK323", "warning", "engine", "P23", "d2t although Vd == V (loads only before vLLM 0.30)", engine=VLLM)
def d2t_with_full_vocab_before_030(ctx: RuleContext):
    if _d2t_with_full_vocab(ctx.spec) and ctx.checked_version < VLLM_D2T_OPTIONAL:
        yield Hit(f"d2t is present but Vd == V: {_v(ctx)} still loads it, but from vLLM "
                  f"{format_version(VLLM_D2T_OPTIONAL)} on the draft fails on the unknown name; drop d2t (and t2d)",
                  tensor="d2t")


@rule("EK307", "error", "engine", "P17", "aux ids only in eagle_config", engine=VLLM)
def ids_only_nested(ctx: RuleContext):
    if ctx.vllm.top_level_ids is None and eagle_config(ctx.spec).get("eagle_aux_hidden_state_layer_ids"):
        nested = eagle_config(ctx.spec)["eagle_aux_hidden_state_layer_ids"]
        yield Hit(f"aux ids {nested} are only in eagle_config: the V2 runner (default in 0.33) ignores them and "
                  f"captures {_default_ids(ctx)}, the V1 runner reads them literally; write vLLM-convention ids "
                  f"{fmt_ids(ctx.spec.aux.ids or ())} top-level", key="eagle_aux_hidden_state_layer_ids")


@rule("EK308", "warning", "engine", "P17", "no aux ids: vLLM falls back to its default", engine=VLLM,
      fix=("write the aux ids the draft was trained on top-level (`eaglekit upgrade DRAFT OUT --aux-layer-ids ...` "
           "writes them); nothing if it was trained on vLLM's default"))
def ids_absent(ctx: RuleContext):
    spec = ctx.spec
    if spec.aux.as_written is None and not spec.facts.trained_on_default_ids:
        yield Hit(f"no aux layer ids recorded: vLLM captures its default {_default_ids(ctx)}; if the draft was "
                  "trained on other layers acceptance collapses: write the training ids top-level",
                  key="eagle_aux_hidden_state_layer_ids")


@rule("EK309", "info", "engine", "P17", "EAGLE draft without ids: the default is its training set", engine=VLLM)
def ids_eagle_default(ctx: RuleContext):
    if ctx.spec.aux.as_written is None and ctx.spec.facts.trained_on_default_ids:
        yield Hit(f"no aux ids recorded: SafeAILab EAGLE trains on vLLM's default {_default_ids(ctx)}, so vLLM "
                  "captures the right layers; a vLLM-ready config writes them", key="eagle_aux_hidden_state_layer_ids")


@rule("EK310", "error", "engine", "P11", "vLLM's K disagrees with fc", engine=VLLM, refuses_load=True)
def k_resolved(ctx: RuleContext):
    K = ctx.spec.num_aux_hidden_states
    if K is None or not ctx.spec.facts.fc_in_features or ctx.vllm.model_class is None:
        return
    if ctx.vllm.k != K:
        where = ("inside transformer_layer_config" if ctx.vllm.layout == "speculators" else "top-level")
        fix = (f"write num_aux_hidden_states: {K} {where}" if ctx.checked_version >= (0, 22, 0)
               else "K != 3 needs vLLM >= 0.22.0")
        yield Hit(f"{_v(ctx)} takes K={ctx.vllm.k} from {ctx.vllm.k_source} but fc.weight holds K={K}: loading fails "
                  f"on shape; {fix}", key="num_aux_hidden_states")


@rule("EK311", "error", "engine", "P38", "the requested vLLM version lacks a feature this draft uses", engine=VLLM,
      fix="serve it with the vLLM release the finding names, or newer")
def version_floor(ctx: RuleContext):
    for floor, why in vllm_requirements(ctx.spec):
        if ctx.checked_version < floor:
            yield Hit(f"{_v(ctx)} is too old: {why} needs >= {format_version(floor)}")


@rule("EK312", "info", "engine", "P50", "minimum vLLM version", engine=VLLM,
      fix="serve it with the vLLM release it names, or newer")
def version_needed(ctx: RuleContext):
    needs = vllm_requirements(ctx.spec)
    if not needs or any(ctx.checked_version < floor for floor, _ in needs):
        return  # nothing beyond the oldest known version, or EK311 already says what is missing
    floor = max(f for f, _ in needs)
    if floor > parse_version(VLLM_OLDEST_KNOWN):
        yield Hit(f"needs vLLM >= {format_version(floor)}: " + "; ".join(why for _, why in needs))


@rule("EK313", "error", "engine", "P13", "tensors of another attention kind than the vLLM class", engine=VLLM,
      refuses_load=True)
def class_attention(ctx: RuleContext):
    view, spec = ctx.vllm, ctx.spec
    if view.model_class is None:
        return
    builds = CLASS_ATTENTION[view.model_class]
    if builds == spec.attention:
        return
    if builds == "llama" and spec.attention == "qwen3":
        yield Hit(f"q_norm/k_norm tensors (a Qwen3 draft) but {view.architecture} loads the Llama class: KeyError on "
                  "layers.0.self_attn.k_norm.weight; use Eagle3Qwen3ForCausalLM (speculators: model_type qwen3)",
                  key="architectures")
    elif builds == "qwen3" and spec.attention == "llama":
        yield Hit(f"{view.architecture} builds per-head q_norm/k_norm but the draft has none: they stay at 1.0; use "
                  "LlamaForCausalLMEagle3", key="architectures", refuses_load=False)
    else:
        yield Hit(f"{view.architecture} builds {builds} attention but the tensors are {spec.attention} attention",
                  key="architectures")


@rule("EK314", "error", "engine", "P14", "EAGLE-1 fc bias", engine=VLLM, refuses_load=True, convertible=False,
      fix="retrain without the fc bias (EAGLE-3 drafts have none), or serve it with SGLang and config 'bias': true")
def fc_bias(ctx: RuleContext):
    cfg = ctx.spec.config
    if "fc.bias" in ctx.spec.tensors:
        yield Hit("fc.bias is not a parameter of vLLM's eagle3 classes (EAGLE-1 leftover): unknown name",
                  tensor="fc.bias")
    elif cfg.get("bias") is True or cfg.get("eagle_fc_bias") is True:
        yield Hit("config asks for an fc bias (EAGLE-1 'bias'/'eagle_fc_bias'), which eagle3 drafts do not have",
                  key="bias" if cfg.get("bias") is True else "eagle_fc_bias")


@rule("EK315", "error", "engine", "P31", "index_topk in an MLA draft without an indexer", engine=VLLM)
def index_topk(ctx: RuleContext):
    spec = ctx.spec
    has_indexer = any(".indexer." in n for n in spec.tensors)
    if spec.attention == "mla" and "index_topk" in layer_config(spec) and not has_indexer:
        yield Hit("index_topk is set (copied from a DeepSeek-V3.2 target?) but the draft has no indexer tensors: vLLM "
                  "adds an uninitialised indexer; remove index_topk", key="index_topk")


@rule("EK316", "info", "engine", "P31", "model_type kimi_k2 for an MLA draft", engine=VLLM,
      fix="nothing for published Kimi drafts; write model_type: deepseek_v3 where a use_mla consumer serves it")
def kimi_model_type(ctx: RuleContext):
    if ctx.spec.attention == "mla" and ctx.spec.config.get("model_type") == "kimi_k2":
        yield Hit("model_type kimi_k2 is outside vLLM's is_deepseek_mla list; published Kimi drafts work, only "
                  "use_mla consumers (NIXL, PCP, DFlash) differ; deepseek_v3 is the strict choice", key="model_type")


@rule("EK317", "warning", "engine", "P31", "MLA draft without q_lora_rank", engine=VLLM,
      fix="vLLM serves it; the fused q_a projection (q_lora_rank) that SGLang needs comes only from retraining")
def mla_q_lora(ctx: RuleContext):
    g = ctx.spec.geometry
    if ctx.spec.attention == "mla" and g.mla is not None and not g.mla.q_lora_rank:
        yield Hit("MLA draft with a null q_lora_rank (plain q_proj): vLLM's stacked mapper assumes the fused q_a "
                  "projection and SGLang rejects it", key="q_lora_rank")


@rule("EK318", "warning", "engine", "P34", "speculators layout not servable as the main model", engine=VLLM,
      fix="pass the draft through --speculative-config, as eaglekit's serve command does, or write the keys it names")
def speculators_main_model(ctx: RuleContext):
    cfg = ctx.spec.config
    if ctx.spec.config_layout != "speculators":
        return
    sc = nested(cfg, "speculators_config")
    methods = sc.get("proposal_methods")
    first = methods[0] if isinstance(methods, list) and methods and isinstance(methods[0], dict) else {}
    verifier = nested(sc, "verifier")
    problems = []
    if not isinstance(first.get("speculative_tokens"), int):
        problems.append("speculators_config.proposal_methods[0].speculative_tokens")
    name = verifier.get("name_or_path")
    if not (isinstance(name, str) and REPO_ID.match(name)):
        problems.append("speculators_config.verifier.name_or_path as a Hub id org/name")
    if not cfg.get("speculators_model_type"):
        problems.append("speculators_model_type")
    if problems:
        yield Hit(f"`vllm serve <draft>` requires {', '.join(problems)}; passing the draft via "
                  "--speculative-config still works", key="speculators_config")


@rule("EK319", "error", "engine", "P3", "a norm flag written where vLLM does not read it", engine=VLLM)
def flags_unread(ctx: RuleContext):
    cfg, ec = ctx.spec.config, eagle_config(ctx.spec)
    if ctx.spec.config_layout != "flat":
        return
    if cfg.get("use_aux_norm") and "fc_norm" not in cfg:
        yield Hit("use_aux_norm is SGLang's legacy name; vLLM reads only fc_norm and rejects the fc_norm tensors: "
                  "write fc_norm: true", key="use_aux_norm")
    for key in ("fc_norm", "norm_output"):
        if key in ec and key not in cfg:
            yield Hit(f"{key} is only in eagle_config; vLLM reads it top-level only and serves EAGLE-3 semantics: "
                      f"write it top-level", key=f"eagle_config.{key}")


def _loads_mask_hidden(ctx: RuleContext) -> bool:
    """Whether the class vLLM picks has the parallel-drafting mask (and skips it without parallel drafting)."""
    return ctx.vllm.model_class == "llama" or (ctx.vllm.model_class == "qwen3"
                                               and ctx.checked_version >= VLLM_QWEN3_MASK_HIDDEN)


@rule("EK320", "warning", "engine", "P30", "mask_hidden outside parallel drafting", engine=VLLM,
      fix="nothing: vLLM skips it; serve with parallel drafting only if the draft was trained for it")
def mask_hidden_llama(ctx: RuleContext):
    if "mask_hidden" in ctx.spec.tensors and not ctx.vllm.parallel_drafting and _loads_mask_hidden(ctx):
        yield Hit("mask_hidden is used only by parallel drafting (P-EAGLE); otherwise vLLM skips it with a warning",
                  tensor="mask_hidden")


@rule("EK321", "error", "engine", "P30", "mask_hidden in a class without parallel drafting", engine=VLLM,
      refuses_load=True)
def mask_hidden_other(ctx: RuleContext):
    if "mask_hidden" in ctx.spec.tensors and ctx.vllm.model_class is not None and not _loads_mask_hidden(ctx):
        yield Hit(f"mask_hidden is an unknown name to {_v(ctx)}'s {ctx.vllm.model_class} eagle3 class; remove it",
                  tensor="mask_hidden")


@rule("EK330", "error", "engine", "P52", "a P-EAGLE draft vLLM cannot load as written", engine=VLLM,
      refuses_load=True)
def peagle_unloadable(ctx: RuleContext):
    view, spec = ctx.vllm, ctx.spec
    if not view.parallel_drafting:
        return
    if "mask_hidden" not in spec.tensors:
        yield Hit("a P-EAGLE draft without mask_hidden: with parallel_drafting vLLM's eagle3 class raises "
                  "\"mask_hidden not found in weights\"; restore the trained mask state", tensor="mask_hidden")
    if view.layout != "speculators" or view.model_class is None:
        return
    if spec.facts.mask_token_id is None:
        yield Hit(f"a speculators P-EAGLE config without an integer mask_token_id: {_v(ctx)}'s update_peagle reads it "
                  "unconditionally (as pard_token) and fails; write the mask token the draft was trained with",
                  key="mask_token_id")
    if "fc_norm" in view.not_carried:
        count = len(spec.facts.fc_norm_tensor_ids)
        yield Hit(f"fc_norm: true in a speculators P-EAGLE config: {_v(ctx)}'s P-EAGLE path (update_peagle) does not "
                  f"carry fc_norm, so its class builds no fc_norm norms and fails on the {count} fc_norm.{{k}}.weight "
                  "tensor(s) (no module or parameter named 'fc_norm'); write the flat layout, which carries it "
                  "(eaglekit upgrade)", key="fc_norm", refuses_load=count > 0)


@rule("EK331", "warning", "engine", "P52", "a P-EAGLE config vLLM reads otherwise than written", engine=VLLM)
def peagle_reread(ctx: RuleContext):
    view, cfg = ctx.vllm, ctx.spec.config
    if not view.parallel_drafting or view.layout != "speculators" or view.model_class is None:
        return
    if "norm_output" in view.not_carried:
        yield Hit(f"norm_output: true in a speculators P-EAGLE config: {_v(ctx)}'s P-EAGLE path does not carry it and "
                  "serves norm_output false without a message; parallel drafting never feeds the draft's state back "
                  "(one forward proposes every token), so only the claim of EAGLE-3.1 is lost; the flat layout "
                  "keeps the flag (eaglekit upgrade)", key="norm_output")
    if "norm_before_residual" not in cfg:
        yield Hit(f"norm_before_residual is not written: {_v(ctx)}'s P-EAGLE path takes "
                  f"{str(PEAGLE_NORM_BEFORE_RESIDUAL_DEFAULT).lower()} where its EAGLE-3 path takes "
                  f"{str(EAGLE3_NORM_BEFORE_RESIDUAL_DEFAULT).lower()} (P12); write the value the draft was trained "
                  "with", key="norm_before_residual")


@rule("EK322", "info", "engine", None, "vLLM-ready keys left implicit", engine=VLLM)
def implicit_keys(ctx: RuleContext):
    cfg = ctx.spec.config
    if ctx.spec.config_layout != "flat":
        return
    absent = [k for k in ("target_hidden_size", "num_aux_hidden_states", "tie_word_embeddings") if k not in cfg]
    if absent:
        yield Hit(f"not written explicitly: {', '.join(absent)}; a vLLM-ready config spells them out so no class "
                  "has to infer them")


def _rope_problem(value: dict) -> str | None:
    """Why vLLM's RoPE factory cannot build from this rope_scaling / rope_parameters object."""
    kind = value.get("rope_type", value.get("type", "default"))
    if not isinstance(kind, str) or kind not in VLLM_ACCEPTS.rope_types:
        return f"type {kind!r} is not one vLLM builds ({', '.join(sorted(VLLM_ACCEPTS.rope_types))})"
    factor = value.get("factor")
    scaled = kind in VLLM_ACCEPTS.rope_factor_types or (kind == "dynamic" and "alpha" not in value)
    if (scaled or "factor" in value) and (isinstance(factor, bool) or not isinstance(factor, (int, float))
                                          or not 0 < factor < float("inf")):
        return f"{kind} scaling needs a factor that is a number > 0, not {factor!r}"
    return None


@rule("EK324", "error", "engine", None, "RoPE scaling vLLM cannot build", engine=VLLM, refuses_load=True,
      refuses_upgrade=True,
      fix="write the rope_scaling / rope_parameters the draft was trained with, of a type vLLM builds")
def rope_scaling(ctx: RuleContext):
    lcfg = layer_config(ctx.spec)
    for key in ("rope_scaling", "rope_parameters"):
        value = lcfg.get(key)
        if isinstance(value, dict) and (why := _rope_problem(value)):  # not an object at all: EK157
            yield Hit(f"{layer_key(ctx.spec, key)}: {why}; {_v(ctx)} fails to build the draft's rotary embedding",
                      key=layer_key(ctx.spec, key))


@rule("EK325", "error", "engine", None, "quantization_config vLLM cannot read", engine=VLLM, refuses_load=True,
      refuses_upgrade=True,
      fix="write the quant_method the weights were quantised with (fp8, modelopt, compressed-tensors, ...)")
def quantization_method(ctx: RuleContext):
    value = ctx.spec.config.get("quantization_config")
    if not isinstance(value, dict):
        return  # absent, or not an object: EK157
    method = value.get("quant_method")
    known = isinstance(method, str) and method.lower().replace("compressed_tensors", "compressed-tensors") \
        in VLLM_ACCEPTS.quant_methods
    if not known:
        yield Hit(f"quantization_config.quant_method {method!r} is not a method {_v(ctx)} knows: it refuses the draft "
                  "(write the method the weights were quantised with, e.g. fp8, modelopt, compressed-tensors)",
                  key="quantization_config.quant_method")


@rule("EK326", "error", "engine", None, "rms_norm_eps beyond float32: every norm outputs 0", engine=VLLM,
      refuses_upgrade=True, fix="write the rms_norm_eps the draft was trained with")
def norm_eps(ctx: RuleContext):
    eps = ctx.spec.geometry.rms_norm_eps
    if eps > VLLM_ACCEPTS.rms_norm_eps_max:
        yield Hit(f"rms_norm_eps is {eps:g}: {_v(ctx)}'s RMSNorm kernel takes eps as a float32, where it becomes inf "
                  "and zeroes every norm; write the eps the draft was trained with",
                  key=layer_key(ctx.spec, "rms_norm_eps"))


@rule("EK328", "error", "engine", None, "hidden_act vLLM's draft MLP does not build", engine=VLLM, refuses_load=True,
      refuses_upgrade=True, fix="write the hidden_act the draft was trained with (EAGLE-3 drafts: silu)")
def hidden_act(ctx: RuleContext):
    value = layer_config(ctx.spec).get("hidden_act", "silu")  # transformers' LlamaConfig and Qwen3Config: silu
    if not isinstance(value, str) or value not in VLLM_ACCEPTS.hidden_acts:
        key = layer_key(ctx.spec, "hidden_act")
        yield Hit(f"{key} is {quoted(value)}: {_v(ctx)}'s draft MLP accepts only "
                  f"{', '.join(sorted(VLLM_ACCEPTS.hidden_acts))} and raises on anything else; EAGLE-3 drafts are "
                  "trained with silu: write the activation the draft was trained with", key=key)


LARGE_EPS = 1e-2
"""Released drafts and targets use 1e-5 or 1e-6; past 1e-2 eps outweighs the mean square of the states it
normalises (a judgement, not an engine limit: the engine runs it)."""


@rule("EK327", "warning", "engine", None, "rms_norm_eps so large that it dominates the norm", engine=VLLM,
      fix="check that it is the rms_norm_eps the draft was trained with (released drafts use 1e-5 or 1e-6)")
def large_norm_eps(ctx: RuleContext):
    eps = ctx.spec.geometry.rms_norm_eps
    if LARGE_EPS < eps <= VLLM_ACCEPTS.rms_norm_eps_max:
        yield Hit(f"rms_norm_eps is {eps:g}, above {LARGE_EPS:g}: {_v(ctx)} runs it, but eps then outweighs the mean "
                  "square of the states it normalises; check it is the eps the draft was trained with",
                  key=layer_key(ctx.spec, "rms_norm_eps"))


def _upgrade_command(ctx: RuleContext) -> str:
    """The upgrade that writes the vLLM-ready layout (as validate's fix prints it), or its name where a long path
    would be cut in the message."""
    spec = ctx.spec
    words = ["eaglekit", "upgrade", spec.path, RECORD.upgrade_output(spec.path)]
    if ctx.target is not None:
        words += ["--target", target_folder(ctx.target.path)]
    if spec.eagle_version == "3":
        words += ["--no-fc-norm", "--no-norm-output"]
    if any(len(word) > MAX_QUOTED_CHARS for word in words):
        return "`eaglekit upgrade` (validate's fix line gives the command)"
    return f"`{shlex.join(words)}`"


@rule("EK329", "error", "engine", "P51", "aux ids written only under the producer's own key (target_layer_ids)",
      engine=VLLM)
def ids_under_own_key(ctx: RuleContext):
    """DeepSpec writes its ids as `target_layer_ids`: what each vLLM runner and class makes of that key."""
    spec, view = ctx.spec, ctx.vllm
    key = spec.facts.aux_ids_key
    written = as_ids(spec.config.get(key))
    if key == TOP_IDS or written is None or spec.config_layout != "flat" or as_ids(spec.config.get(TOP_IDS)):
        return
    default = _default_ids(ctx)
    v2 = (f"the V2 runner reads {key} plus 1 and captures {fmt_ids(view.top_level_ids or ())}" if view.v2_key == key
          else f"the V2 runner ignores {key} and captures {default}")
    v1 = f"the V1 runner ignores it and captures {fmt_ids(view.v1_ids) if view.v1_ids else default}"
    target_arch = ctx.target.architectures[0] if ctx.target is not None and ctx.target.architectures else None
    runner = vllm_default_runner(ctx.checked_version, target_arch).upper()
    parts = [f"aux ids {fmt_ids(written)} are written only as {key} ({spec.producer}: vLLM ids "
             f"{fmt_ids(spec.aux.ids or ())}); in {_v(ctx)} {v2}, {v1} ({runner} is the default here)"]
    K = spec.num_aux_hidden_states
    if K is not None and spec.facts.fc_in_features and view.k != K:
        parts.append(f"no eagle3 class takes K from it (K={view.k} from {view.k_source}, fc.weight holds K={K})")
    if view.problem:
        parts.append(f"and {view.problem} (EK301)")
    strangers = sorted(ref.source_name for name, ref in spec.tensors.items()
                       if not carried(name) and not tolerated_extra(spec, name))
    fix = (f"no upgrade serves it: {examples(strangers)} have no place in any eagle3 class (EK104)" if strangers
           else f"{_upgrade_command(ctx)} writes a registered architecture with these ids as "
                "eagle_aux_hidden_state_layer_ids (top level and eagle_config) and num_aux_hidden_states")
    yield Hit("; ".join(parts) + ": " + fix, key=key)
