"""TensorRT-LLM rules: how its PyTorch backend (1.2.0) reads this checkpoint (eaglekit.engines.trtllm)."""

from __future__ import annotations

from eaglekit.engines.base import output_of_layer
from eaglekit.engines.trtllm import DEFAULT_K, TRTLLM, capture_setting, default_capture
from eaglekit.rules.facts import fmt_ids
from eaglekit.rules.registry import Hit, RuleContext, rule


@rule("EK361", "warning", "engine", "P19", "TensorRT-LLM captures its own default layers", engine=TRTLLM,
      fix=("put the eagle3_layers_to_capture setting `eaglekit validate DRAFT --engine trtllm` prints in "
           "speculative_config"))
def capture(ctx: RuleContext):
    ids = ctx.spec.aux.ids
    if not ids or output_of_layer(ids) is None:
        return
    num_layers = ctx.target.num_layers if ctx.target is not None else None
    default = default_capture(num_layers) if num_layers is not None else None
    if default is not None and sorted(default) == sorted(ids) and len(ids) == DEFAULT_K:
        return
    now = (f"its default {fmt_ids(default)} (vLLM convention) for L={num_layers}" if default
           else "its default (1, N//2-1, N-4), which it refuses for N <= 5" if num_layers is not None
           else "its default (1, N//2-1, N-4), output-of-layer")
    yield Hit(f"TensorRT-LLM never reads the draft's ids and captures {now}; the draft was trained on "
              f"{fmt_ids(ids)} (vLLM convention): put `{capture_setting(ids)}` in speculative_config",
              key="eagle_aux_hidden_state_layer_ids")


@rule("EK362", "error", "engine", "P18", "embedding among the aux states, which TensorRT-LLM cannot capture",
      engine=TRTLLM, convertible=False, fix="serve it with vLLM, which captures the embedding output (id 0)")
def embedding_capture(ctx: RuleContext):
    ids = ctx.spec.aux.ids
    if ids and min(ids) == 0:
        yield Hit(f"aux ids {fmt_ids(ids)} include the embedding output (vLLM id 0); TensorRT-LLM captures layer "
                  "outputs only (-1 means the final state), so no setting reproduces the training input",
                  key="eagle_aux_hidden_state_layer_ids")


@rule("EK363", "error", "engine", "P8", "norm_before_fc written where TensorRT-LLM does not read it", engine=TRTLLM)
def norm_before_fc_place(ctx: RuleContext):
    if ctx.trtllm.norm_before_fc_ignored:
        yield Hit("norm_before_fc: true is written at the top level, but TensorRT-LLM reads it only inside "
                  "eagle_config: it builds no input_norm and skips input_norm.weight (eaglekit upgrade --to trtllm "
                  "writes it there)", key="norm_before_fc")


@rule("EK365", "error", "engine", "P22", "d2t that TensorRT-LLM never creates", engine=TRTLLM, refuses_load=True)
def d2t_parameter(ctx: RuleContext):
    vocab = ctx.spec.vocab
    if not vocab.has_d2t or ctx.trtllm.d2t_loaded or vocab.vocab_size is None:
        return
    if vocab.draft_vocab_size < vocab.vocab_size:
        why = ("config has no draft_vocab_size (it assumes vocab_size)" if ctx.trtllm.draft_vocab_size is None
               else "draft_vocab_size equals vocab_size")
        yield Hit(f"{why}: TensorRT-LLM builds no d2t and a {vocab.vocab_size}-row head, but lm_head has "
                  f"{vocab.draft_vocab_size} rows; write draft_vocab_size: {vocab.draft_vocab_size}",
                  key="draft_vocab_size")


@rule("EK366", "error", "engine", "P13", "per-head q/k norms, which TensorRT-LLM's Llama draft lacks", engine=TRTLLM,
      convertible=False, fix="serve it with vLLM (Eagle3Qwen3ForCausalLM)")
def qk_norms(ctx: RuleContext):
    if ctx.spec.attention == "qwen3":
        yield Hit("q_norm/k_norm tensors (a Qwen3-architecture draft): TensorRT-LLM's EAGLE-3 draft is Llama "
                  "attention (eagle3_model_arch llama3) and has no per-head norms",
                  tensor="layers.0.self_attn.q_norm.weight")
