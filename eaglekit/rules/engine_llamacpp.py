"""llama.cpp rules: what its EAGLE-3 GGUF path (build b11434) can carry of this checkpoint (eaglekit.engines.llamacpp).

llama.cpp loads GGUF, so every finding here is about the conversion: what a GGUF for `--spec-type draft-eagle3`
can hold, and what llama.cpp's own converter would silently get wrong.
"""

from __future__ import annotations

from eaglekit.config_view import as_ids
from eaglekit.engines.llamacpp import LATEST, LLAMACPP, NUM_TARGET_LAYERS, TARGET_MODEL_TYPES, converter_layers
from eaglekit.rules.expected import quant_companions
from eaglekit.rules.facts import examples, fmt_ids, not_one_layer
from eaglekit.rules.registry import Hit, RuleContext, rule


@rule("EK371", "error", "engine", "P38", "EAGLE-3.1 functions llama.cpp does not implement", engine=LLAMACPP,
      convertible=False, fix="serve it with vLLM, SGLang, TensorRT-LLM or tokenspeed")
def eagle31(ctx: RuleContext):
    flags = ctx.spec.flags
    missing = [name for name, on in (("fc_norm", flags.fc_norm), ("norm_output", flags.norm_output)) if on]
    if missing:
        yield Hit(f"{' and '.join(missing)} on: llama.cpp's EAGLE-3 draft has no such function (its converter drops "
                  "the flags silently); serve this draft with vLLM, SGLang, TensorRT-LLM or tokenspeed",
                  key=missing[0])


@rule("EK372", "error", "engine", "P11", "llama.cpp takes exactly three target layers", engine=LLAMACPP,
      refuses_load=True, convertible=False, fix="serve it with vLLM, which takes the K the draft was trained with")
def three_layers(ctx: RuleContext):
    K = ctx.spec.num_aux_hidden_states
    if K is not None and K != NUM_TARGET_LAYERS:
        yield Hit(f"the draft reads K={K} target states; llama.cpp's eagle3 loader requires exactly "
                  f"{NUM_TARGET_LAYERS}", key="eagle_aux_hidden_state_layer_ids")


@rule("EK373", "error", "engine", "P2", "more than one draft layer, which llama.cpp refuses", engine=LLAMACPP,
      refuses_load=True, convertible=False, fix="serve it with vLLM, which builds multi-layer drafts")
def one_layer(ctx: RuleContext):
    if n := not_one_layer(ctx.spec):
        yield Hit(f"{n} decoder layers: llama.cpp's eagle3 graph asserts exactly one", key="num_hidden_layers")


@rule("EK374", "error", "engine", "P13", "attention llama.cpp's eagle3 draft does not build", engine=LLAMACPP,
      convertible=False, fix="serve it with vLLM, which has Qwen3 and MLA eagle3 classes")
def attention(ctx: RuleContext):
    spec = ctx.spec
    if spec.attention == "mla":
        yield Hit("an MLA draft: llama.cpp's eagle3 draft is Llama attention only", key="kv_lora_rank")
    elif spec.attention == "qwen3":
        yield Hit("q_norm/k_norm tensors (a Qwen3-architecture draft): llama.cpp's eagle3 draft has no per-head "
                  "norms", tensor="layers.0.self_attn.q_norm.weight")
    if spec.geometry.attention_bias:
        yield Hit("attention bias: llama.cpp's eagle3 draft has no q/k/v/o bias tensors", key="attention_bias")


@rule("EK377", "error", "engine", "P14", "an fc bias, which llama.cpp's eagle3 draft does not have", engine=LLAMACPP,
      refuses_load=True, convertible=False,
      fix="retrain without the fc bias, or serve it with SGLang and config 'bias': true")
def fc_bias(ctx: RuleContext):
    if "fc.bias" in ctx.spec.tensors:
        yield Hit("fc.bias (an EAGLE-1 leftover): llama.cpp's eagle3 loader creates fc.weight only, so a GGUF holding "
                  "the bias fails its tensor count and one without it computes another function", tensor="fc.bias")


@rule("EK378", "error", "engine", None, "quantisation tensors, which no GGUF of an eagle3 draft carries",
      engine=LLAMACPP, convertible=False, fix="serve the quantised draft with vLLM, or convert its unquantised weights")
def quantised(ctx: RuleContext):
    companions = [c.name for c in quant_companions(ctx.spec)]
    if companions:
        yield Hit(f"{examples(companions)}: llama.cpp's eagle3 loader creates no scale or zero-point tensors and "
                  "eaglekit's GGUF conversion writes F32/F16/BF16 weights only; serve the quantised draft with vLLM, "
                  "or convert its unquantised weights", tensor=companions[0])


@rule("EK375", "warning", "engine", "P17", "llama.cpp's own converter would write other target layers",
      engine=LLAMACPP)
def converter_ids(ctx: RuleContext):
    ids = ctx.spec.aux.ids
    if not ids or ctx.target is None:
        return
    written = converter_layers(as_ids(ctx.spec.config.get("eagle_aux_hidden_state_layer_ids")), ctx.target.num_layers)
    if sorted(written) != sorted(ids):
        yield Hit(f"convert_hf_to_gguf.py writes eagle3.target_layers {fmt_ids(written)} (the top-level id list as "
                  f"written, else [2, L//2, L-3]), but the draft was trained on {fmt_ids(ids)} (vLLM convention): "
                  "convert with eaglekit upgrade --to gguf, which writes the draft's own layers",
                  key="eagle_aux_hidden_state_layer_ids")


@rule("EK376", "warning", "engine", "P21", "target whose llama.cpp graph is not known to hand out layer inputs",
      engine=LLAMACPP, fix="serve it with vLLM or SGLang, or measure its acceptance in llama.cpp before relying on it")
def target_graph(ctx: RuleContext):
    target = ctx.target
    if target is not None and target.model_type and target.model_type not in TARGET_MODEL_TYPES:
        yield Hit(f"target model_type {target.model_type!r}: llama.cpp {LATEST} records the layer inputs "
                  f"EAGLE-3 reads in the {', '.join(TARGET_MODEL_TYPES)} graphs, not known for this one")
