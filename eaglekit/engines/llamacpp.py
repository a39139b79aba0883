"""What llama.cpp (upstream, build 9606 and later: `--spec-type draft-eagle3`) reads from an EAGLE-3 draft.

llama.cpp loads GGUF only. Its converter (`convert_hf_to_gguf.py --target-model-dir`, conversion/llama.py) detects
a draft by `draft_vocab_size` plus one layer, and writes `eagle3.target_layers` = [2, N//2, N-3] whatever the draft
was trained on; it never reads fc_norm, norm_output or norm_before_fc. The loader (src/models/eagle3.cpp) wants
exactly three target layers (input-of-layer, vLLM's convention), one decoder layer, Llama attention (no q/k norms,
no bias), an I64 `d2t` of absolute target ids, and borrows a missing token_embd / output from the target. Only
target graphs that record layer inputs can feed it.
"""

from __future__ import annotations

NAME = "llamacpp"
LABEL = "llama.cpp"
VERSION = "9606"  # the first build with EAGLE-3 drafts (ggml-org/llama.cpp #18039)
ARCH = "eagle3"
NUM_TARGET_LAYERS = 3
# Hugging Face model_type of the targets whose llama.cpp graphs record layer inputs (t_layer_inp)
TARGET_MODEL_TYPES = ("llama", "qwen3", "qwen3_moe", "qwen3_next", "qwen3_5", "qwen3_5_moe", "gemma4",
                      "minimax_m2", "gpt_oss")


def converter_layers(num_layers: int) -> tuple[int, ...]:
    """What llama.cpp's own converter writes as target layers, whatever the draft's config says."""
    return (2, num_layers // 2, num_layers - 3)
