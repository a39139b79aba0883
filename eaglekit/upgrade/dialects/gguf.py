"""llama.cpp's GGUF (`--spec-type draft-eagle3`): one file, tensors under llama.cpp's names (eaglekit.catalogue),
the draft's geometry and target layers as `eagle3.*` metadata, the target's tokenizer copied in.

llama.cpp's eagle3 draft is an EAGLE-3 draft only: one Llama decoder layer without bias, exactly three target
states, llama3 (or no) rope scaling, no fc_norm or norm_output. Everything else is refused before a byte is written.
"""

from __future__ import annotations

from typing import Any

from eaglekit.catalogue import dropped, lookup, output_name
from eaglekit.engines import LLAMACPP
from eaglekit.engines.llamacpp import NUM_TARGET_LAYERS
from eaglekit.spec import DraftSpec
from eaglekit.target import TargetInfo
from eaglekit.upgrade import gguf as gguf_file
from eaglekit.upgrade.decide import Decisions
from eaglekit.upgrade.dialects import NO_PARALLEL_DRAFTING, NO_QWEN3_CLASS
from eaglekit.upgrade.vocab import VocabPlan

NAME = "gguf"
ENGINE = LLAMACPP
FINETUNE_READS = False
ONE_FILE = True  # one GGUF file: nothing to shard
CANNOT_WRITE: dict[str, str] = {
    "qwen3": NO_QWEN3_CLASS,
    "parallel_drafting": NO_PARALLEL_DRAFTING,
    "eagle31": "the source is an EAGLE-3.1 draft (trained fc_norm / norm_output), which llama.cpp cannot run; serve "
               "it with vLLM, SGLang, TensorRT-LLM or tokenspeed",
}
CAVEATS: dict[str, str] = {}
WRITER = gguf_file
ROPE_TYPES = ("llama3", "default")  # the rope scalings llama.cpp's eagle3 draft reads


def read_family(spec: DraftSpec, d: Decisions) -> str:
    return "vllm"


def config(spec: DraftSpec, d: Decisions, vocab: VocabPlan) -> dict[str, Any]:
    """Nothing beside the file: the metadata is written into the GGUF by its writer."""
    return {}


def tensor_name(canonical: str, spec: DraftSpec) -> str | None:
    return output_name(canonical, NAME, spec)


def _placeless(name: str, spec: DraftSpec) -> bool:
    """A tensor llama.cpp's eagle3 draft has no place for, and that the GGUF cannot leave out either."""
    found = lookup(name)
    left_out = found is not None and found[0].gguf_drop is not None
    return tensor_name(name, spec) is None and not left_out and not dropped(name)


def refusal(spec: DraftSpec, d: Decisions, target: TargetInfo | None) -> str | None:
    """Why this draft cannot become an upstream llama.cpp EAGLE-3 GGUF (None: it can)."""
    if d.fc_norm or d.norm_output:
        what = [n for n, on in (("fc_norm", d.fc_norm), ("norm_output", d.norm_output)) if on]
        return (f"{' and '.join(what)}: llama.cpp's EAGLE-3 draft has no such function; an EAGLE-3.1 draft cannot be "
                "written as GGUF for it (an EAGLE-3 source needs --no-fc-norm --no-norm-output)")
    if d.num_aux != NUM_TARGET_LAYERS:
        return f"K={d.num_aux} target states: llama.cpp's eagle3 loader takes exactly {NUM_TARGET_LAYERS}"
    if spec.geometry.num_layers != 1:
        return f"{spec.geometry.num_layers} decoder layers: llama.cpp's eagle3 graph has exactly one"
    if spec.attention != "llama" or spec.geometry.attention_bias:
        kind = "attention bias" if spec.geometry.attention_bias else f"{spec.attention} attention"
        return f"{kind}: llama.cpp's eagle3 draft is Llama attention without bias"
    scaling = spec.geometry.rope_scaling
    if scaling and gguf_file.rope_type(scaling) not in ROPE_TYPES:
        return f"rope_scaling {gguf_file.rope_type(scaling)!r}: llama.cpp's eagle3 draft reads llama3 rope factors only"
    if target is None or not target.path.endswith(".gguf"):
        return ("--target must be the target's GGUF file: its tokenizer goes into the draft, whose vocabulary "
                "llama.cpp checks against the target's")
    unsupported = sorted(n for n in spec.tensors if _placeless(n, spec))
    if unsupported:
        return f"tensors llama.cpp's eagle3 draft has no place for: {', '.join(unsupported[:4])}"
    return None
