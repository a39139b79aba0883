"""One case per rule: a builder of a checkpoint with the rule's defect and one of its healthy twin (tiny drafts
from tests.support.factory), plus the small array and config edits the cases are made of."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from eaglekit.rules import all_rules
from tests.support.factory import (
    DEEPSPEC,
    Recipe,
    canonical_tensors,
    edit_config,
    make_draft,
    make_target_config,
    rewrite_tensors,
)

RULES = {r.code: r for r in all_rules()}
# attention after ids 4, 8, 12
HYBRID = ["linear_attention", "linear_attention", "linear_attention", "full_attention"] * 3


TOP = {"eagle_aux_hidden_state_layer_ids": [2, 6, 9]}
FP8 = {"quantization_config": {"quant_method": "fp8"}}


def draft(p: Path, layout: str = "vllm", **kw) -> str:
    return make_draft(str(p / "draft"), layout, **kw)


def target(p: Path, **kw) -> str:
    return make_target_config(str(p / "target"), **kw)


def hybrid_target(p: Path) -> str:
    return edit_config(target(p), lambda c: c.update(layer_types=HYBRID))


def ids(*values: int) -> dict:
    """Aux ids written where a vLLM-ready config writes them: top level and eagle_config."""
    return {"eagle_aux_hidden_state_layer_ids": list(values),
            "eagle_config": {"eagle_aux_hidden_state_layer_ids": list(values), "use_aux_hidden_state": True}}


def array(name: str, **recipe) -> np.ndarray:
    return canonical_tensors(Recipe(**recipe))[name].copy()


def with_array(name: str, fn, **recipe) -> dict:
    return {name: fn(array(name, **recipe))}


def renamed(path: str, rename: Callable[[str], str]) -> str:
    return rewrite_tensors(path, lambda t: {rename(n): v for n, v in t.items()})


def layer_names(i: int, **recipe) -> tuple[str, ...]:
    return tuple(n for n in canonical_tensors(Recipe(**recipe)) if n.startswith(f"layers.{i}."))


def set_tlc(path: str, **values) -> str:
    return edit_config(path, lambda c: c["transformer_layer_config"].update(values))


def set_zero(rows):
    def fn(a):
        a[rows] = 0.0
        return a
    return fn


def d2t_edit(fn):
    return with_array("d2t", fn)


def _dup(d2t):
    d2t[1] = d2t[0] - 1  # draft 1 -> the target id of draft 0
    return d2t


def _absolute(d2t):
    return d2t + np.arange(d2t.size)


def _out_of_range(d2t):
    d2t[-1] = 10_000
    return d2t


def _t2d_extra(t2d):
    t2d[np.flatnonzero(~t2d)[0]] = True
    return t2d


def _t2d_moved(t2d):
    t2d[np.flatnonzero(t2d)[0]] = False
    t2d[np.flatnonzero(~t2d)[-1]] = True
    return t2d


def _nan(a):
    a[3, 5] = np.nan
    return a


def _nested_norm_before_fc(c):
    """norm_before_fc where TensorRT-LLM reads it: inside eagle_config only."""
    c.pop("norm_before_fc")
    c["eagle_config"]["norm_before_fc"] = True


def _d2t_as_i32(t):
    _, shape, raw = t["d2t"]
    t["d2t"] = ("I32", shape, np.frombuffer(raw, dtype="<i8").astype("<i4").tobytes())


@dataclass
class Case:
    code: str
    broken: Callable[[Path], object]
    healthy: Callable[[Path], object]
    version: str | None = None
    label: str = ""

    @property
    def id(self) -> str:
        return f"{self.code}-{self.label}" if self.label else self.code


def _fc_as_fp8(tensors: dict) -> dict:
    """fc.weight stored as one fp8 byte per value, the way an fp8-serialised export writes it."""
    _, shape, _ = tensors["fc.weight"]
    return {**tensors, "fc.weight": ("F8_E4M3", shape, bytes(int(np.prod(shape))))}


WARM_START = {"command": "upgrade", "function": "warm-start", "summary": "warm start: needs fine-tuning"}

CASES = [
    # ---------------------------------------------------------------- structure
    Case("EK101", lambda p: draft(p, config_patch={"num_hidden_layers": 36}), lambda p: draft(p), label="config-36"),
    Case("EK101", lambda p: draft(p, config_patch={"num_hidden_layers": None}), lambda p: draft(p), label="absent"),
    Case("EK101", lambda p: set_tlc(draft(p, "speculators"), num_hidden_layers=2), lambda p: draft(p, "speculators"),
         label="speculators"),
    Case("EK102", lambda p: draft(p, layers=3, drop=layer_names(1, layers=3)), lambda p: draft(p, layers=3)),
    Case("EK103", lambda p: draft(p, drop=("layers.0.mlp.down_proj.weight",)), lambda p: draft(p)),
    Case("EK103", lambda p: draft(p, attention="mla", drop=("layers.0.self_attn.kv_b_proj.weight",)),
         lambda p: draft(p, attention="mla"), label="mla"),
    Case("EK104", lambda p: draft(p, add={"parallel_draft_heads.0.weight": np.ones((4, 4), np.float32)}),
         lambda p: draft(p, add={"layers.0.self_attn.rotary_emb.inv_freq": np.ones(8, np.float32)})),
    Case("EK105", lambda p: draft(p, config_patch={"head_dim": 8}), lambda p: draft(p)),
    Case("EK106", lambda p: rewrite_tensors(draft(p), _d2t_as_i32), lambda p: draft(p), label="int32-d2t"),
    Case("EK159", lambda p: draft(p, add={"norm.weight": np.arange(64, dtype=np.int64)}), lambda p: draft(p),
         label="integer-norm"),
    Case("EK159", lambda p: draft(p, config_patch=FP8, add={"norm.weight": np.zeros(64, bool)}),
         lambda p: draft(p, config_patch=FP8), label="bool-beside-quantization"),
    Case("EK158",
         lambda p: draft(p, config_patch=FP8, add={"layers.0.mlp.nothing.weight_scale": np.ones(1, np.float32)}),
         lambda p: draft(p, config_patch=FP8, add={"layers.0.mlp.up_proj.weight_scale": np.ones(128, np.float32)}),
         label="scale-of-no-weight"),
    Case("EK158", lambda p: draft(p, config_patch=FP8, add={"lm_head.weight_zero_point": np.zeros((16, 2), np.int64)}),
         lambda p: draft(p, config_patch=FP8, add={"lm_head.weight_zero_point": np.zeros(128, np.int64)}),
         label="head-zero-point-not-per-row"),
    Case("EK160", lambda p: rewrite_tensors(draft(p, config_patch=FP8), _fc_as_fp8),
         lambda p: rewrite_tensors(draft(p, config_patch=FP8, add={"fc.weight_scale": np.ones(1, np.float32)}),
                                   _fc_as_fp8), label="fp8-fc-without-scale"),
    Case("EK107",
         lambda p: renamed(draft(p, layers=2), lambda n: n.replace("layers.1.input_layernorm", "layers.1.hidden_norm")),
         lambda p: draft(p, layers=2)),
    Case("EK108", lambda p: draft(p, add={"layers.0.0.mlp.gate_proj.weight": np.ones((4, 4), np.float32)}),
         lambda p: draft(p)),
    Case("EK109", lambda p: draft(p, add={"draft_model.fc.weight": np.ones((4, 4), np.float32)}), lambda p: draft(p)),
    Case("EK110", lambda p: draft(p, fc_norm=True, drop=("fc_norm.1.weight",)), lambda p: draft(p, fc_norm=True)),
    Case("EK111", lambda p: draft(p, fc_norm=True, config_patch={"fc_norm": False}), lambda p: draft(p, fc_norm=True)),
    Case("EK112", lambda p: draft(p, norm_before_fc=True, drop=("input_norm.weight",)),
         lambda p: draft(p, norm_before_fc=True)),
    Case("EK113", lambda p: draft(p, norm_before_fc=True, config_patch={"norm_before_fc": None}),
         lambda p: draft(p, norm_before_fc=True)),
    Case("EK114", lambda p: draft(p, fc_norm=True, norm_before_fc=True), lambda p: draft(p, fc_norm=True)),
    Case("EK115", lambda p: draft(p, norm_before_fc=True), lambda p: draft(p)),
    Case("EK116", lambda p: draft(p, attention="mla", norm_before_fc=True, config_patch={"norm_before_fc": True}),
         lambda p: draft(p, attention="mla")),
    Case("EK120", lambda p: draft(p, config_patch={"target_hidden_size": 80}), lambda p: draft(p)),
    Case("EK121", lambda p: draft(p, config_patch={"num_aux_hidden_states": 4}), lambda p: draft(p)),
    Case("EK122", lambda p: draft(p, config_patch=ids(2, 6, 9, 11)), lambda p: draft(p)),
    Case("EK123",
         lambda p: draft(p, fc_norm=True, target_hidden=96, embed=True, config_patch={"target_hidden_size": None}),
         lambda p: draft(p, fc_norm=True, target_hidden=96, embed=True)),
    Case("EK124", lambda p: draft(p, target_hidden=96), lambda p: draft(p, target_hidden=96, embed=True)),
    Case("EK125", lambda p: draft(p, config_patch={"intermediate_size": 128}), lambda p: draft(p)),
    Case("EK130", lambda p: draft(p, drop=("d2t", "t2d")), lambda p: draft(p)),
    Case("EK131", lambda p: draft(p, config_patch={"draft_vocab_size": 100}), lambda p: draft(p)),
    Case("EK132", lambda p: draft(p, drop=("lm_head.weight",)), lambda p: draft(p)),
    Case("EK133", lambda p: draft(p, draft_vocab=None, lm_head=False), lambda p: draft(p, draft_vocab=None)),
    Case("EK134", lambda p: draft(p, config_patch={"tie_word_embeddings": True}), lambda p: draft(p)),
    Case("EK135", lambda p: draft(p, draft_vocab=None, config_patch={"tie_word_embeddings": True}),
         lambda p: draft(p, draft_vocab=None)),
    Case("EK136", lambda p: draft(p, "modelopt"), lambda p: draft(p)),
    Case("EK137", lambda p: draft(p, "torchspec"), lambda p: draft(p, "torchspec", draft_vocab=None)),
    Case("EK140", lambda p: draft(p, config_patch=ids(2, 6, 6)), lambda p: draft(p)),
    Case("EK141", lambda p: draft(p, config_patch=ids(9, 2, 6)), lambda p: draft(p)),
    Case("EK142", lambda p: draft(p, "angelslim", config_patch={"eagle_aux_hidden_state_layer_ids": [3, 6, 9]}),
         lambda p: draft(p, "angelslim")),
    Case("EK143", lambda p: draft(p, "angelslim", config_patch={"eagle_aux_hidden_state_layer_ids": [2, 6, 9]}),
         lambda p: draft(p, "angelslim")),
    Case("EK144", lambda p: draft(p, config_patch=ids(1, 5, 8)), lambda p: draft(p)),
    Case("EK145", lambda p: draft(p, "specforge", aux_ids=(3, 7, 10)), lambda p: draft(p, "specforge")),
    Case("EK146", lambda p: draft(p, config_patch={"eagle_config": {"eagle_aux_hidden_state_layer_ids": [2, 6, 10]}}),
         lambda p: draft(p, config_patch={"eagle_config": {"eagle_aux_hidden_state_layer_ids": [1, 5, 8]}}),
         label="twin-is-the-sglang-split"),
    Case("EK150", lambda p: draft(p, "speculators", norm_before_residual=None), lambda p: draft(p, "speculators")),
    Case("EK151", lambda p: draft(p, "specforge"), lambda p: draft(p)),
    Case("EK152", lambda p: draft(p, "modelopt-vllm"),
         lambda p: draft(p, "modelopt-vllm", config_patch={"norm_before_residual": False})),
    Case("EK153", lambda p: draft(p, "specforge", norm_output=True), lambda p: draft(p, "specforge")),
    Case("EK154",
         lambda p: set_tlc(draft(p, "speculators-train"), layer_types=["sliding_attention"], sliding_window=2048,
                           use_sliding_window=True),
         lambda p: draft(p, "speculators-train")),
    Case("EK155", lambda p: draft(p, "eagle"), lambda p: draft(p)),
    Case("EK156", lambda p: draft(p, config_patch={"eaglekit": WARM_START}),
         lambda p: draft(p, config_patch={"eaglekit": {"command": "finetune", "source_provenance": WARM_START}})),
    Case("EK156", lambda p: draft(p, config_patch={"eaglekit": {"command": "upgrade", "function": "preserved",
                                                                "source_provenance": WARM_START}}),
         lambda p: draft(p, config_patch={"eaglekit": {"command": "upgrade", "function": "preserved"}}),
         label="re-upgraded"),
    # ---------------------------------------------------------------- target
    Case("EK201", lambda p: (draft(p), target(p, vocab=300)), lambda p: (draft(p), target(p))),
    Case("EK202", lambda p: (draft(p), target(p, hidden=96)), lambda p: (draft(p), target(p))),
    Case("EK203", lambda p: (draft(p, config_patch=ids(2, 6, 13)), target(p)), lambda p: (draft(p), target(p))),
    Case("EK204", lambda p: (draft(p, config_patch=ids(2, 6, 12)), target(p)), lambda p: (draft(p), target(p))),
    Case("EK205", lambda p: (draft(p, config_patch=ids(1, 5, 8)), target(p)), lambda p: (draft(p), target(p))),
    Case("EK206", lambda p: (draft(p), hybrid_target(p)),
         lambda p: (draft(p, config_patch=ids(4, 8, 12)), hybrid_target(p))),
    Case("EK207", lambda p: (draft(p, "eagle"), hybrid_target(p)),
         lambda p: (draft(p, "eagle", config_patch={"eagle_aux_hidden_state_layer_ids": [4, 8, 12]}),
                    hybrid_target(p))),
    # ---------------------------------------------------------------- vLLM
    Case("EK301", lambda p: draft(p, "angelslim", config_patch={"architectures": ["Qwen3ForCausalLMEagle3"], **TOP}),
         lambda p: draft(p, "angelslim", config_patch=TOP)),
    Case("EK301", lambda p: draft(p, config_patch={"model_type": "eagle"}),
         lambda p: draft(p), label="model-type-eagle"),
    Case("EK301", lambda p: set_tlc(draft(p, "speculators"), model_type="deepseek_v3"),
         lambda p: draft(p, "speculators"), label="speculators-mla"),
    Case("EK302", lambda p: renamed(draft(p), lambda n: n if n.startswith("lm_head") else "model." + n),
         lambda p: draft(p)),
    Case("EK303", lambda p: draft(p, "modelopt-megatron", layers=2), lambda p: draft(p, layers=2)),
    Case("EK304", lambda p: renamed(draft(p, fc_norm=True), lambda n: n.replace("fc_norm.0", "aux_norm_low")),
         lambda p: draft(p, fc_norm=True)),
    Case("EK157", lambda p: edit_config(draft(p), lambda c: c.update(hidden_size="64")), lambda p: draft(p),
         label="string"),
    Case("EK157", lambda p: edit_config(draft(p), lambda c: c.update(num_attention_heads=0)), lambda p: draft(p),
         label="zero-heads"),
    Case("EK157", lambda p: edit_config(draft(p), lambda c: c.update(rms_norm_eps=float("nan"))), lambda p: draft(p),
         label="nan-eps"),
    Case("EK157", lambda p: edit_config(draft(p), lambda c: c.update(rope_theta=-1)), lambda p: draft(p),
         label="negative-theta"),
    Case("EK157", lambda p: edit_config(draft(p), lambda c: c.update(eagle_aux_hidden_state_layer_ids=[True, 5, 9])),
         lambda p: draft(p), label="bool-ids"),
    Case("EK157", lambda p: edit_config(draft(p, "speculators"),
                                        lambda c: c["transformer_layer_config"].update(head_dim=0)),
         lambda p: draft(p, "speculators"), label="speculators-head-dim"),
    Case("EK324", lambda p: draft(p, config_patch={"rope_scaling": {"rope_type": "banana", "factor": 2.0}}),
         lambda p: draft(p, config_patch={"rope_scaling": {"rope_type": "linear", "factor": 2.0}}),
         label="unknown-type"),
    Case("EK324", lambda p: draft(p, config_patch={"rope_scaling": {"type": "yarn", "factor": -1.0,
                                                                    "original_max_position_embeddings": 4096}}),
         lambda p: draft(p), label="negative-factor"),
    Case("EK325", lambda p: draft(p, config_patch={"quantization_config": {"quant_method": "banana"}}),
         lambda p: draft(p, config_patch=FP8)),
    Case("EK326", lambda p: draft(p, config_patch={"rms_norm_eps": 1e308}), lambda p: draft(p)),
    Case("EK327", lambda p: draft(p, config_patch={"rms_norm_eps": 0.5}), lambda p: draft(p)),
    Case("EK328", lambda p: draft(p, config_patch={"hidden_act": "gelu"}),
         lambda p: draft(p, config_patch={"hidden_act": "silu"})),
    Case("EK329", lambda p: draft(p, "deepspec", **DEEPSPEC), lambda p: draft(p, **DEEPSPEC)),
    Case("EK157", lambda p: draft(p, config_patch={"torch_dtype": "banana"}),
         lambda p: draft(p, config_patch={"torch_dtype": "bfloat16"}),
         label="torch-dtype-name"),
    Case("EK305",
         lambda p: renamed(draft(p, "modelopt-megatron", layers=2), lambda n: n.replace("midlayer.", "layers.")),
         lambda p: draft(p, layers=2)),
    Case("EK306", lambda p: draft(p, draft_vocab=None, add={"d2t": np.zeros(256, np.int64)}),
         lambda p: draft(p, draft_vocab=None)),
    Case("EK323", lambda p: draft(p, draft_vocab=None, add={"d2t": np.zeros(256, np.int64)}),
         lambda p: draft(p, draft_vocab=None), version="0.29"),
    Case("EK307", lambda p: draft(p, "specforge"), lambda p: draft(p)),
    Case("EK308", lambda p: draft(p, "angelslim"), lambda p: draft(p)),
    Case("EK309", lambda p: draft(p, "eagle"), lambda p: draft(p)),
    Case("EK310", lambda p: draft(p, "speculators", k=4, aux_ids=(2, 4, 6, 9)),
         lambda p: set_tlc(draft(p, "speculators", k=4, aux_ids=(2, 4, 6, 9)), num_aux_hidden_states=4),
         label="speculators-k4"),
    Case("EK310", lambda p: draft(p, k=4, aux_ids=(2, 4, 6, 9), config_patch={"num_aux_hidden_states": None,
                                                                             "eagle_config": None}),
         lambda p: draft(p, k=4, aux_ids=(2, 4, 6, 9)), label="k4-top-level-only"),
    Case("EK311", lambda p: draft(p, fc_norm=True), lambda p: draft(p), version="0.21", label="3.1-on-0.21"),
    Case("EK311", lambda p: draft(p, attention="mla", fc_norm=True), lambda p: draft(p, attention="mla"),
         version="0.22.1", label="mla-fc_norm-on-0.22"),
    Case("EK311", lambda p: draft(p, "speculators", fc_norm=True), lambda p: draft(p, "speculators"),
         version="0.24", label="speculators-3.1-on-0.24"),
    Case("EK312", lambda p: draft(p, fc_norm=True, norm_output=True), lambda p: draft(p)),
    Case("EK313", lambda p: draft(p, attention="qwen3", config_patch={"architectures": ["LlamaForCausalLMEagle3"]}),
         lambda p: draft(p, attention="qwen3"), label="qwen3-tensors-llama-class"),
    Case("EK313", lambda p: draft(p, config_patch={"architectures": ["Eagle3Qwen3ForCausalLM"]}), lambda p: draft(p),
         label="llama-tensors-qwen3-class"),
    Case("EK314", lambda p: draft(p, add={"fc.bias": np.zeros(64, np.float32)}), lambda p: draft(p)),
    Case("EK315", lambda p: draft(p, attention="mla", config_patch={"index_topk": 64}),
         lambda p: draft(p, attention="mla")),
    Case("EK316", lambda p: draft(p, attention="mla"),
         lambda p: draft(p, attention="mla", config_patch={"model_type": "deepseek_v3"})),
    Case("EK317", lambda p: draft(p, attention="mla", q_lora_rank=None), lambda p: draft(p, attention="mla")),
    Case("EK318",
         lambda p: edit_config(draft(p, "speculators"),
                               lambda c: c["speculators_config"]["verifier"].update(name_or_path="/data/target")),
         lambda p: draft(p, "speculators")),
    Case("EK319", lambda p: draft(p, fc_norm=True, config_patch={"fc_norm": None, "use_aux_norm": True}),
         lambda p: draft(p, fc_norm=True)),
    Case("EK320", lambda p: draft(p, add={"mask_hidden": np.ones((1, 192), np.float32)}), lambda p: draft(p)),
    Case("EK320", lambda p: draft(p, attention="qwen3", add={"mask_hidden": np.ones((1, 192), np.float32)}),
         lambda p: draft(p, attention="qwen3"), label="qwen3-from-0.25"),
    Case("EK321", lambda p: draft(p, attention="qwen3", add={"mask_hidden": np.ones((1, 192), np.float32)}),
         lambda p: draft(p, attention="qwen3"), version="0.24"),
    Case("EK322", lambda p: draft(p, "specforge"), lambda p: draft(p)),
    Case("EK330", lambda p: draft(p, "peagle", fc_norm=True), lambda p: draft(p, "peagle"), label="fc_norm"),
    Case("EK330", lambda p: draft(p, "peagle", drop=("mask_hidden",)), lambda p: draft(p, "peagle"),
         label="no-mask_hidden"),
    Case("EK331", lambda p: draft(p, "peagle", norm_output=True), lambda p: draft(p, "peagle"), label="norm_output"),
    Case("EK331", lambda p: draft(p, "peagle", norm_before_residual=None), lambda p: draft(p, "peagle"),
         label="norm_before_residual-default"),
    # ---------------------------------------------------------------- SGLang
    Case("EK351", lambda p: draft(p), lambda p: draft(p, "specforge"), label="vllm-ids-on-llama-target"),
    Case("EK351", lambda p: (draft(p), target(p)), lambda p: (draft(p, config_patch={"eagle_config": None}), target(p)),
         label="twin-without-eagle-config-uses-default"),
    Case("EK352", lambda p: draft(p, "specforge", config_patch={"norm_before_residual": True}),
         lambda p: draft(p, "specforge")),
    Case("EK353", lambda p: draft(p, attention="mla", q_lora_rank=None), lambda p: draft(p, attention="mla")),
    Case("EK354", lambda p: draft(p, "specforge", attention="qwen3"), lambda p: draft(p, "specforge")),
    Case("EK354", lambda p: renamed(draft(p, "specforge"), lambda n: n.replace("fc.", "context_proj.")),
         lambda p: draft(p, "specforge"), label="torchspec-fork-names"),
    Case("EK355", lambda p: draft(p, "specforge", config_patch={"num_aux_hidden_states": 4}),
         lambda p: draft(p, "specforge")),
    Case("EK356", lambda p: draft(p, "specforge", add={"fc.bias": np.zeros(64, np.float32)}),
         lambda p: draft(p, "specforge")),
    Case("EK357", lambda p: draft(p, "speculators"), lambda p: draft(p, "specforge")),
    # ---------------------------------------------------------------- TensorRT-LLM (twins carry a target: its
    # capture default is then known, and equals the factory's ids)
    Case("EK361", lambda p: (draft(p, aux_ids=(3, 6, 9)), target(p)), lambda p: (draft(p), target(p))),
    Case("EK361", lambda p: draft(p), lambda p: (draft(p), target(p)), label="no-target-no-default-known"),
    Case("EK362", lambda p: (draft(p, aux_ids=(0, 6, 9)), target(p)), lambda p: (draft(p), target(p))),
    Case("EK363", lambda p: (draft(p, norm_before_fc=True), target(p)),
         lambda p: (edit_config(draft(p, norm_before_fc=True), _nested_norm_before_fc), target(p))),
    Case("EK365", lambda p: (draft(p, config_patch={"draft_vocab_size": None}), target(p)),
         lambda p: (draft(p), target(p))),
    Case("EK366", lambda p: (draft(p, attention="qwen3"), target(p)), lambda p: (draft(p), target(p))),
    # ---------------------------------------------------------------- llama.cpp
    Case("EK371", lambda p: draft(p, fc_norm=True, norm_output=True), lambda p: draft(p)),
    Case("EK372", lambda p: draft(p, k=4, aux_ids=(2, 4, 6, 9)), lambda p: draft(p)),
    Case("EK373", lambda p: draft(p, layers=2), lambda p: draft(p)),
    Case("EK374", lambda p: draft(p, attention="mla"), lambda p: draft(p), label="mla"),
    Case("EK374", lambda p: draft(p, attention="qwen3"), lambda p: draft(p), label="qwen3"),
    # SpecForge keeps its ids in eagle_config only, which llama.cpp's converter never reads: it writes the default
    Case("EK377", lambda p: draft(p, add={"fc.bias": np.zeros(64, np.float32)}), lambda p: draft(p)),
    Case("EK378",
         lambda p: draft(p, config_patch=FP8, add={"layers.0.mlp.up_proj.weight_scale": np.ones(1, np.float32)}),
         lambda p: draft(p)),
    Case("EK375", lambda p: (draft(p, "specforge", aux_ids=(3, 6, 9)), target(p)),
         lambda p: (draft(p, aux_ids=(3, 6, 9)), target(p))),
    Case("EK376", lambda p: (draft(p), edit_config(target(p), lambda c: c.update(model_type="falcon_h1"))),
         lambda p: (draft(p), target(p))),
    # ---------------------------------------------------------------- tokenspeed (output-of-layer ids: SpecForge's)
    Case("EK381", lambda p: draft(p), lambda p: draft(p, "specforge"), label="vllm-ids-in-eagle-config"),
    Case("EK381", lambda p: draft(p, config_patch={"eagle_config": None}), lambda p: draft(p, "specforge"),
         label="vllm-ids-top-level"),
    Case("EK382", lambda p: draft(p, "specforge", k=4, aux_ids=(2, 4, 6, 9)), lambda p: draft(p, "specforge")),
    Case("EK383", lambda p: draft(p, "specforge", target_hidden=96), lambda p: draft(p, "specforge")),
    Case("EK384", lambda p: draft(p, "specforge", config_patch={"eagle_config": {
        "eagle_aux_hidden_state_layer_ids": [1, 5, 8], "return_hidden_post_norm": True}}),
         lambda p: draft(p, "specforge", norm_output=True)),
    Case("EK385", lambda p: draft(p, layers=2), lambda p: draft(p, "specforge")),
    Case("EK386", lambda p: draft(p, "specforge", config_patch={"architectures": ["Eagle3LlamaForCausalLM"]}),
         lambda p: draft(p, "specforge")),
    # ---------------------------------------------------------------- deep
    Case("EK401", lambda p: draft(p, add=with_array("layers.0.mlp.down_proj.weight", _nan)), lambda p: draft(p)),
    Case("EK402", lambda p: draft(p, add=with_array("fc.weight", np.zeros_like)), lambda p: draft(p)),
    Case("EK403", lambda p: draft(p, add=with_array("layers.0.mlp.up_proj.weight", lambda a: np.full_like(a, 0.5))),
         lambda p: draft(p)),
    Case("EK404", lambda p: draft(p, fc_norm=True, add=with_array("fc_norm.0.weight", np.ones_like, fc_norm=True)),
         lambda p: draft(p, fc_norm=True)),
    Case("EK405", lambda p: draft(p, add=with_array("norm.weight", np.ones_like)), lambda p: draft(p)),
    Case("EK406", lambda p: draft(p, add=with_array("lm_head.weight", set_zero(slice(0, 10)))), lambda p: draft(p)),
    Case("EK407", lambda p: draft(p, add=d2t_edit(_out_of_range)), lambda p: draft(p)),
    Case("EK408", lambda p: draft(p, add=d2t_edit(_dup)), lambda p: draft(p)),
    Case("EK409", lambda p: draft(p, add=d2t_edit(_absolute)), lambda p: draft(p)),
    Case("EK410", lambda p: draft(p, add=with_array("t2d", _t2d_extra)), lambda p: draft(p)),
    Case("EK411", lambda p: draft(p, add=with_array("t2d", _t2d_moved)), lambda p: draft(p)),
    Case("EK412", lambda p: draft(p, draft_vocab=None, add={"d2t": np.zeros(256, np.int64)}),
         lambda p: draft(p, draft_vocab=None)),
    Case("EK413", lambda p: draft(p, frequency_ordered=True), lambda p: draft(p)),
]
