"""What llama.cpp reads from an EAGLE-3 draft, as read at build b11434 (`--spec-type draft-eagle3`, from b9606).

llama.cpp loads GGUF only. Its converter (`convert_hf_to_gguf.py --target-model-dir`, conversion/llama.py)
detects a draft by `draft_vocab_size` plus one layer, writes `eagle3.target_layers` from the *top-level*
`eagle_aux_hidden_state_layer_ids` as written (else [2, N//2, N-3]; an id list only in eagle_config is never
read), and carries `norm_before_fc` / `norm_before_residual`; fc_norm and norm_output are dropped silently. The
loader (src/models/eagle3.cpp) wants exactly three target layers (input-of-layer, vLLM's convention), one
decoder layer, Llama attention (no q/k norms, no bias), an I64 `d2t` of absolute target ids and, with
norm_before_fc, `enc.output_norm.weight`; a missing token_embd / output is borrowed from the target. Only
target graphs that record layer inputs can feed it.
"""

from __future__ import annotations

import os

from eaglekit.engines.base import Engine, Version, parse_version
from eaglekit.spec import DraftSpec

LLAMACPP = "llamacpp"
LATEST = "b11434"
FIRST_EAGLE3 = "b9606"  # ggml-org/llama.cpp #18039: --spec-type draft-eagle3
ARCH = "eagle3"
NUM_TARGET_LAYERS = 3
# Hugging Face model_type of the targets whose llama.cpp graphs record layer inputs (t_layer_inp)
TARGET_MODEL_TYPES = ("llama", "qwen3", "qwen3_moe", "qwen3_next", "qwen3_5", "qwen3_5_moe", "gemma4",
                      "minimax_m2", "gpt_oss", "lfm2", "nemotron_h", "deepseek_v4", "bailing_moe_v3", "mimo_v2")


def speculative_binary() -> str:
    """llama.cpp's `llama-speculative-simple`: $EAGLEKIT_LLAMA_CPP, else where scripts/llamacpp-build.sh builds it
    in the eaglekit checkout (.llama-cpp/build/bin)."""
    checkout = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    return os.environ.get("EAGLEKIT_LLAMA_CPP") or os.path.join(checkout, ".llama-cpp", "build", "bin",
                                                                "llama-speculative-simple")


def converter_layers(top_level_ids: tuple[int, ...] | None, num_layers: int) -> tuple[int, ...]:
    """What llama.cpp's own converter writes as target layers: the top-level list as written, else the default."""
    return tuple(top_level_ids) if top_level_ids else (2, num_layers // 2, num_layers - 3)


def requirements(spec: DraftSpec) -> list[tuple[Version, str]]:
    needs = [(parse_version(FIRST_EAGLE3), "EAGLE-3 drafts: --spec-type draft-eagle3")]
    if spec.flags.norm_before_fc:
        needs.append((parse_version(LATEST), f"norm_before_fc as read at {LATEST}"))
    return needs


def serve_command(target: str, draft: str, k: int, settings: tuple[str, ...] = ()) -> str:
    return f"llama-server -m {target} -md {draft} --spec-type draft-eagle3 --spec-draft-n-max {k}"


RECORD = Engine(
    name=LLAMACPP, label="llama.cpp", latest=LATEST, oldest=LATEST, loads="gguf", dialect="gguf",
    rules_module="eaglekit.rules.engine_llamacpp", requirements=requirements, serve=serve_command,
)
