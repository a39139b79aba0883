"""llama.cpp rules: what its EAGLE-3 GGUF path (build b9606 on) can carry of this checkpoint (eaglekit.engines.llamacpp).

llama.cpp loads GGUF, so every finding here is about the conversion: what a GGUF for `--spec-type draft-eagle3`
can hold, and what llama.cpp's own converter would silently get wrong.
"""

from __future__ import annotations

from eaglekit.engines import LLAMACPP
from eaglekit.engines.llamacpp import NUM_TARGET_LAYERS, TARGET_MODEL_TYPES, converter_layers
from eaglekit.rules.facts import fmt_ids
from eaglekit.rules.registry import Hit, RuleContext, rule


@rule("EK371", "error", "engine", "P38", "EAGLE-3.1 functions llama.cpp does not implement", engine=LLAMACPP, convertible=False)
def eagle31(ctx: RuleContext):
    flags = ctx.spec.flags
    missing = [name for name, on in (("fc_norm", flags.fc_norm), ("norm_output", flags.norm_output),
                                     ("norm_before_fc", flags.norm_before_fc)) if on]
    if missing and not flags.norm_output_legacy_specforge:
        yield Hit(f"{' and '.join(missing)} on: llama.cpp's EAGLE-3 draft has no such function (its converter drops "
                  "the flags silently); serve this draft with vLLM, SGLang, TensorRT-LLM or tokenspeed",
                  key=missing[0])


@rule("EK372", "error", "engine", "P11", "llama.cpp takes exactly three target layers", engine=LLAMACPP,
      refuses_load=True, convertible=False)
def three_layers(ctx: RuleContext):
    K = ctx.spec.num_aux_hidden_states
    if K is not None and K != NUM_TARGET_LAYERS:
        yield Hit(f"the draft reads K={K} target states; llama.cpp's eagle3 loader requires exactly "
                  f"{NUM_TARGET_LAYERS}", key="eagle_aux_hidden_state_layer_ids")


@rule("EK373", "error", "engine", "P2", "more than one draft layer, which llama.cpp refuses", engine=LLAMACPP,
      refuses_load=True, convertible=False)
def one_layer(ctx: RuleContext):
    n = ctx.spec.geometry.num_layers
    if n != 1:
        yield Hit(f"{n} decoder layers: llama.cpp's eagle3 graph asserts exactly one", key="num_hidden_layers")


@rule("EK374", "error", "engine", "P13", "attention llama.cpp's eagle3 draft does not build", engine=LLAMACPP, convertible=False)
def attention(ctx: RuleContext):
    spec = ctx.spec
    if spec.attention == "mla":
        yield Hit("an MLA draft: llama.cpp's eagle3 draft is Llama attention only", key="kv_lora_rank")
    elif spec.attention == "qwen3":
        yield Hit("q_norm/k_norm tensors (a Qwen3-architecture draft): llama.cpp's eagle3 draft has no per-head "
                  "norms", tensor="layers.0.self_attn.q_norm.weight")
    if spec.geometry.attention_bias:
        yield Hit("attention bias: llama.cpp's eagle3 draft has no q/k/v/o bias tensors", key="attention_bias")


@rule("EK375", "warning", "engine", "P17", "llama.cpp's own converter writes the default target layers",
      engine=LLAMACPP)
def converter_ids(ctx: RuleContext):
    ids = ctx.spec.aux.ids
    if not ids or ctx.target is None:
        return
    written = converter_layers(ctx.target.num_layers)
    if sorted(ids) != sorted(written):
        yield Hit(f"convert_hf_to_gguf.py writes eagle3.target_layers {fmt_ids(written)} for L={ctx.target.num_layers} "
                  f"whatever the config says, but the draft was trained on {fmt_ids(ids)}: convert with eaglekit "
                  "upgrade --to gguf, which writes the draft's own layers", key="eagle_aux_hidden_state_layer_ids")


@rule("EK376", "error", "engine", "P21", "target whose llama.cpp graph does not hand out layer inputs",
      engine=LLAMACPP, convertible=False)
def target_graph(ctx: RuleContext):
    target = ctx.target
    if target is not None and target.model_type and target.model_type not in TARGET_MODEL_TYPES:
        yield Hit(f"target model_type {target.model_type!r}: llama.cpp records the target's layer inputs for EAGLE-3 "
                  f"only in the {', '.join(TARGET_MODEL_TYPES)} graphs")
