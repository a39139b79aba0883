"""What TensorRT-LLM's PyTorch backend reads from an EAGLE-3 draft, as read at 1.2.0rc2.

From `_torch/models/modeling_speculative.py` (Eagle3DraftModel, Eagle3ForCausalLM), `_torch/speculative/eagle3.py`
and `llmapi/llm_args.py` (EagleDecodingConfig). The capture layers are an engine setting, never the draft's
config: `eagle3_layers_to_capture`, output-of-layer, default {1, N//2 - 1, N - 4}; its length is also the K that
sizes `fc` (3 when unset). With fc_norm and norm_before_fc both on it applies fc_norm only (EK114 refuses
that pair for every engine).
"""

from __future__ import annotations

from dataclasses import dataclass

from eaglekit.config_view import as_int, nested
from eaglekit.engines.base import Engine, output_of_layer, single_release_requirements
from eaglekit.spec import DraftSpec
from eaglekit.target import TargetInfo

TRTLLM = "trtllm"
LATEST = "1.2.0"
ARCHITECTURES = ("EAGLE3LlamaForCausalLM", "Eagle3DeepSeekV3ForCausalLM")
"""Registered draft classes; the default one-model path ignores `architectures` and builds `eagle3_model_arch`."""
DEFAULT_K = 3
MIN_TARGET_LAYERS = 6  # Eagle3SpecMetadata raises for N <= 5 when no layers are set


@dataclass(frozen=True)
class TrtllmView:
    """What the rules need of its config reading: fc_norm is read top level, norm_output top level or as
    eagle_config.return_hidden_post_norm (every eaglekit output writes both where it reads them), norm_before_fc
    only inside eagle_config; MLA when kv_lora_rank is set."""

    norm_before_fc_ignored: bool  # written top level, where TensorRT-LLM does not look
    d2t_loaded: bool  # the d2t parameter exists only when draft_vocab_size differs from the draft's vocab_size
    draft_vocab_size: int | None  # None: absent, TensorRT-LLM then assumes vocab_size


def trtllm_view(spec: DraftSpec) -> TrtllmView:
    cfg = spec.config
    nbf = nested(cfg, "eagle_config").get("norm_before_fc") is True
    vocab, draft_vocab = as_int(cfg.get("vocab_size")), as_int(cfg.get("draft_vocab_size"))
    effective = draft_vocab if draft_vocab is not None else vocab
    return TrtllmView(
        norm_before_fc_ignored=cfg.get("norm_before_fc") is True and not nbf,
        d2t_loaded=effective is not None and vocab is not None and effective != vocab,
        draft_vocab_size=draft_vocab,
    )


def default_capture(num_layers: int) -> tuple[int, ...] | None:
    """The engine's default capture list in vLLM convention (input-of-layer); None where it raises (N <= 5)."""
    if num_layers < MIN_TARGET_LAYERS:
        return None
    return tuple(i + 1 for i in (1, num_layers // 2 - 1, num_layers - 4))


def capture_setting(ids: tuple[int, ...] | None) -> str | None:
    """The speculative_config line that pins the capture layers to `ids` (vLLM convention); None: inexpressible."""
    written = output_of_layer(ids) if ids else None
    return f"eagle3_layers_to_capture: [{', '.join(str(i) for i in written)}]" if written else None


def settings(spec: DraftSpec, target: TargetInfo | None = None) -> tuple[str, ...]:
    """Always the capture layers: it never reads the draft's ids (none when the ids cannot be expressed)."""
    setting = capture_setting(spec.aux.ids) if spec.aux.ids else None
    return (setting,) if setting else ()


def serve_command(target: str, draft: str, k: int, settings: tuple[str, ...] = ()) -> str:
    lines = ["cat > eagle3.yaml <<'EOF'", "speculative_config:", "  decoding_type: Eagle3",
             f"  max_draft_len: {k}", f"  speculative_model: {draft}", *(f"  {s}" for s in settings), "EOF",
             f"trtllm-serve {target} --extra_llm_api_options eagle3.yaml"]
    return "\n".join(lines)


RECORD = Engine(
    name=TRTLLM, label="TensorRT-LLM", latest=LATEST, oldest=LATEST, loads="safetensors", dialect="trtllm",
    rules_module="eaglekit.rules.engine_trtllm",
    requirements=single_release_requirements(LATEST, f"EAGLE-3.1 as read at {LATEST}"),
    serve=serve_command, settings=settings,
)
