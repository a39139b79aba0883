"""SGLang rules: how SGLang 0.5.23's Llama and Kimi/MLA eagle3 drafts read this checkpoint (reference §4, §5)."""

from __future__ import annotations

from eaglekit.engines.sglang import SGLANG, sglang_capture
from eaglekit.families.names import legacy_pattern
from eaglekit.rules.facts import examples, fc_k_disagreeing, fmt_ids, names_in_source
from eaglekit.rules.registry import Hit, RuleContext, rule

_IGNORED = legacy_pattern("sglang")


@rule("EK351", "error", "engine", "P19", "SGLang captures other layers than the draft was trained on", engine=SGLANG)
def capture(ctx: RuleContext):
    intended = ctx.spec.aux.ids
    if intended is None or ctx.spec.aux.as_written is None:
        return
    view = ctx.sglang
    captured = sglang_capture(view, ctx.target)
    if captured is None or sorted(set(captured)) == sorted(set(intended)):
        return
    path = "DeepSeek/Kimi-target path (shifts only when the first id is 1)" if view.deepseek_target else \
        "Llama-target path (always adds 1)"
    where = f"eagle_config ids {fmt_ids(view.eagle_config_ids)}" if view.eagle_config_ids else "its default"
    ordered = sorted(intended)
    if view.deepseek_target:
        fix = ordered if ordered[0] != 1 else None
    else:
        fix = [i - 1 for i in ordered] if ordered[0] >= 1 else None
    remedy = f"write eagle_config ids {fmt_ids(fix)} for SGLang" if fix else "SGLang cannot express this list"
    yield Hit(f"SGLang's {path} turns {where} into layers {fmt_ids(captured)}, but the draft was trained on "
              f"{fmt_ids(intended)} (vLLM convention): {remedy}", key="eagle_config.eagle_aux_hidden_state_layer_ids")


@rule("EK352", "error", "engine", "P12", "norm_before_residual: true, which SGLang cannot do", engine=SGLANG,
      convertible=False, fix="serve it with vLLM, which reads norm_before_residual")
def norm_before_residual(ctx: RuleContext):
    if ctx.spec.config.get("norm_before_residual") is True:
        yield Hit("norm_before_residual is true but SGLang has no such switch (always false): it serves this draft "
                  "with a different layer-0 residual than it was trained with", key="norm_before_residual")


@rule("EK353", "error", "engine", "P31", "MLA draft SGLang's Kimi class rejects", engine=SGLANG, convertible=False,
      fix="serve it with vLLM, which builds it")
def mla_shape(ctx: RuleContext):
    spec = ctx.spec
    if spec.attention != "mla" or spec.geometry.mla is None:
        return
    if not spec.geometry.mla.q_lora_rank:
        yield Hit("SGLang's MLA draft requires a non-null q_lora_rank", key="q_lora_rank")
    if spec.geometry.num_layers != 1:
        yield Hit(f"SGLang's MLA draft requires num_hidden_layers == 1, not {spec.geometry.num_layers}",
                  key="num_hidden_layers")


@rule("EK354", "error", "engine", "P30", "tensors SGLang silently ignores", engine=SGLANG)
def ignored_names(ctx: RuleContext):
    names = names_in_source(ctx.spec, lambda n: bool(_IGNORED.search(n)))
    if names:
        yield Hit(f"{len(names)} tensor(s) under TorchSpec-fork names ({examples(names)}): SGLang skips unknown names "
                  "and keeps random weights; rename to fc, hidden_norm, norm")
    if ctx.spec.attention == "qwen3":
        yield Hit("q_norm/k_norm tensors (a Qwen3-architecture draft): SGLang's Llama eagle3 draft has no per-head "
                  "norms and skips them", tensor="layers.0.self_attn.q_norm.weight")


@rule("EK355", "error", "engine", "P11", "SGLang's K disagrees with fc", engine=SGLANG)
def k_resolved(ctx: RuleContext):
    if K := fc_k_disagreeing(ctx.spec, ctx.sglang.k):
        yield Hit(f"SGLang takes K={ctx.sglang.k} from {ctx.sglang.k_source} but fc.weight holds K={K}: loading fails "
                  f"on shape; write num_aux_hidden_states: {K}", key="num_aux_hidden_states")


@rule("EK356", "error", "engine", "P14", "fc bias and config 'bias' disagree", engine=SGLANG)
def fc_bias(ctx: RuleContext):
    has, wants = "fc.bias" in ctx.spec.tensors, ctx.spec.config.get("bias") is True
    if has and not wants:
        yield Hit("fc.bias is present but config 'bias' is not true: SGLang skips it", tensor="fc.bias")
    elif wants and not has:
        yield Hit("config 'bias' is true but there is no fc.bias: SGLang keeps an uninitialised bias", key="bias")


@rule("EK357", "warning", "engine", "P15", "speculators layout, which the SGLang facts do not cover", engine=SGLANG)
def speculators_layout(ctx: RuleContext):
    if ctx.spec.config_layout == "speculators":
        yield Hit("speculators config layout: how SGLang 0.5.23 reads transformer_layer_config and its top-level ids "
                  "is not established; serve SGLang the flat layout (eaglekit upgrade --to sglang)",
                  key="speculators_config")
