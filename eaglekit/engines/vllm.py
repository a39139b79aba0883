"""What vLLM reads from an EAGLE-3 draft, by version (reference §4 and §11, 0.21.0 .. 0.33.0): the class its
Eagle3 rewrite picks, the flags and K that class reads, the aux ids each model runner captures, and the config
values it accepts."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from eaglekit.config_view import as_ids, as_int, nested
from eaglekit.decode import POOLED_TAU
from eaglekit.engines.base import NESTED_IDS, TOP_IDS, Engine, IdReading, Version, format_version, parse_version
from eaglekit.errors import UsageError, quoted
from eaglekit.spec import DraftSpec
from eaglekit.target import TargetInfo

VLLM = "vllm"
LATEST = "0.33.0"
VLLM_OLDEST_KNOWN = "0.21.0"

# architectures[0] after vLLM's Eagle3 rewrite -> model class (registry.py, 0.33.0)
VLLM_EAGLE3_CLASSES: dict[str, str] = {
    "LlamaForCausalLMEagle3": "llama",
    "Eagle3LlamaForCausalLM": "llama",
    "Eagle3MiniMaxM2ForCausalLM": "llama",
    "Eagle3Qwen2_5vlForCausalLM": "llama",
    "Eagle3Qwen3vlForCausalLM": "llama",
    "PEagleDraftModel": "llama",
    "PeagleLlamaForCausalLM": "llama",
    "Eagle3Qwen3ForCausalLM": "qwen3",
    "PeagleQwen3ForCausalLM": "qwen3",
    "Eagle3DeepseekV2ForCausalLM": "deepseek",
    "Eagle3DeepseekV3ForCausalLM": "deepseek",
}
VLLM_D2T_OPTIONAL = (0, 30, 0)  # from here draft_id_to_target_id exists only when Vd < V
# The V2 runner's fallback when no top-level eagle_aux_hidden_state_layer_ids is written: a top-level
# `target_layer_ids` (DSpark's and DeepSpec's key, output-of-layer) plus 1 (v1/worker/gpu/spec_decode/eagle/
# eagle3_utils.py get_eagle3_aux_layers_from_config, read in 0.25.0, 0.29.0, 0.32.0 and 0.33.0; absent in 0.24.0).
# The V1 runner (gpu_model_runner._get_eagle3_aux_layers_from_config) never reads it.
V2_FALLBACK_IDS = "target_layer_ids"
VLLM_V2_READS_TARGET_LAYER_IDS = (0, 25, 0)

# P-EAGLE through vLLM's speculators path: update_peagle (vllm/transformers_utils/configs/speculators/algos.py, read at
# 0.22.0, 0.23.0, 0.25.0, 0.26.0, 0.29.0, 0.32.0 and 0.33.0; 0.21.0 has no "peagle" type and refuses the config)
# starts from transformer_layer_config and copies draft_vocab_size, target_hidden_size, norm_before_residual (default
# False, where update_eagle3 defaults it to True), norm_before_fc, the aux ids, and mask_token_id as pard_token
# (KeyError without it). It copies neither fc_norm nor norm_output at any of those versions: the class then builds no
# fc_norm norms (AutoWeightsLoader fails on the fc_norm.{k}.weight tensors) and feeds back the pre-norm state.
VLLM_PEAGLE_SPECULATORS = (0, 22, 0)
VLLM_PEAGLE_ARCH_MAP = (0, 25, 0)  # before: PeagleLlamaForCausalLM whatever the model_type
PEAGLE_SPECULATORS_ARCHITECTURES = {"llama": "PeagleLlamaForCausalLM", "qwen3": "PeagleQwen3ForCausalLM"}
PEAGLE_NOT_CARRIED = ("fc_norm", "norm_output")
PEAGLE_NORM_BEFORE_RESIDUAL_DEFAULT = False
EAGLE3_NORM_BEFORE_RESIDUAL_DEFAULT = True  # update_eagle3, same file
# The parallel-drafting token: LLMBaseProposer._init_parallel_drafting_params (v1/spec_decode/llm_base_proposer.py,
# 0.32.0 and 0.33.0) takes the first of these the draft config has (after dflash_config.mask_token_id), and raises
# without one. The eagle3 classes load mask_hidden only with parallel_drafting (llama_eagle3.py, qwen3_eagle3.py
# load_weights: skipped with a warning otherwise, and a ValueError when parallel_drafting finds none), which the
# speculative config must set: only `vllm serve <draft>` derives it from speculators_model_type (speculators/base.py).
VLLM_PARALLEL_TOKEN_KEYS = ("mask_token_id", "dspark_noise_token_id", "pard_token", "ptd_token_id")
VLLM_QWEN3_MASK_HIDDEN = (0, 25, 0)  # qwen3_eagle3.py loads mask_hidden (read at 0.25.0, 0.26.0, 0.32.0, 0.33.0)


@dataclass(frozen=True)
class ConfigAcceptance:
    """The config values an engine builds a draft from: anything else it refuses, or computes garbage with."""

    rope_types: frozenset[str]  # rope_type (or legacy `type`) values its RoPE factory builds
    rope_factor_types: frozenset[str]  # the types that scale by `factor` (which must then be a number > 0)
    quant_methods: frozenset[str]  # quantization_config.quant_method values it knows
    rms_norm_eps_max: float  # the largest eps its kernel can hold (past it the eps becomes inf, every norm output 0)
    hidden_acts: frozenset[str]  # hidden_act values its draft MLP builds


VLLM_ACCEPTS = ConfigAcceptance(
    # get_rope (rotary_embedding/__init__.py, 0.33) raises "Unknown RoPE scaling type" for anything else; "su" and
    # "mrope" are legacy names its config patch maps to longrope and default
    rope_types=frozenset({"default", "llama3", "mllama4", "linear", "ntk", "dynamic", "xdrope", "yarn",
                          "deepseek_yarn", "deepseek_llama_scaling", "longrope", "openpangu", "su", "mrope"}),
    rope_factor_types=frozenset({"llama3", "linear", "ntk", "yarn", "deepseek_yarn", "deepseek_llama_scaling"}),
    # QUANTIZATION_METHODS over the releases modelled (0.21 .. 0.33); ModelConfig calls .get on the object and
    # raises "Unknown quantization method" for a method outside the list
    quant_methods=frozenset({
        "awq", "auto_awq", "fp8", "fbgemm_fp8", "ptpc_fp8", "fp_quant", "modelopt", "modelopt_fp4", "modelopt_mxfp8",
        "modelopt_mixed", "gguf", "gptq", "auto_gptq", "gptq_marlin", "gptq_marlin_24", "gptq_bitblas", "awq_marlin",
        "bitblas", "compressed-tensors", "bitsandbytes", "experts_int8", "quark", "moe_wna16", "torchao", "inc",
        "auto-round", "rtn", "hqq", "mxfp4", "gpt_oss_mxfp4", "petit_nvfp4", "deepseek_v4_fp8", "cpu_awq", "humming",
        "online", "fp8_per_tensor", "fp8_per_block", "fp8_per_channel", "int8_per_channel_weight_only",
        "nvfp4_per_token", "mxfp8", "tpu_int8", "deepspeedfp", "ipex",
    }),
    # the RMSNorm kernels take eps as a float32: past its largest finite value it is inf and every norm output 0
    rms_norm_eps_max=3.4028234663852886e38,
    # LlamaMLP (llama.py, which the eagle3 Llama draft layers subclass) and Qwen2MLP (qwen3.py's MLP) raise
    # "Unsupported activation: ... Only silu is supported for now." for anything else
    hidden_acts=frozenset({"silu"}),
)
# the attention kind each vLLM class builds
CLASS_ATTENTION = {"llama": "llama", "qwen3": "qwen3", "deepseek": "mla"}
# vLLM's speculators path forces the class from transformer_layer_config.model_type
SPECULATORS_ARCHITECTURES = {"llama": "Eagle3LlamaForCausalLM", "qwen3": "Eagle3Qwen3ForCausalLM"}


# ---------------------------------------------------------------- drafts of other speculative methods
# Read from vLLM 0.33.0: vllm/config/speculative.py (SpeculativeMethod, SpeculativeConfig.__post_init__ and
# hf_config_override), vllm/model_executor/models/registry.py (_SPECULATIVE_DECODING_MODELS),
# vllm/transformers_utils/configs/speculators/algos.py and base.py, vllm/v1/worker/gpu/spec_decode/__init__.py and
# eagle/eagle3_utils.py. "since": the first release whose SpeculativeConfig and registry serve these drafts under
# that method, read in the 0.10.0, 0.10.2, 0.11.0 .. 0.33.0 wheels: "mtp" replaced the per-model *_mtp methods in
# 0.11.0; parallel_drafting (reading pard_token) came in 0.16.0; dflash in 0.20.0; dspark in 0.25.0;
# DFlash2DraftModel in 0.28.0 (speculators dflash2 in 0.29.0); LiLiCorr in 0.31.0; XPress in 0.33.0.
VLLM_OTHER_METHODS_READ_AT = "0.33.0"


@dataclass(frozen=True)
class VllmDraftMethod:
    """How vLLM serves the drafts of one non-EAGLE-3 method."""

    method: str  # the --speculative-config method
    since: str
    architectures: frozenset[str]  # draft architectures its registry maps to this method's classes
    settings: tuple[tuple[str, Any], ...] = ()  # what else the speculative config must say


VLLM_DRAFT_METHODS: dict[str, VllmDraftMethod] = {
    # qwen3_dflash.py; EAGLEConfig (configs/eagle.py) prefixes DFlash to other names, so LiLiCorr, MuseGlimmer and
    # Laguna drafts are served by the DFlash runtime too (spec_decode/__init__.py picks the speculator)
    "dflash": VllmDraftMethod("dflash", "0.20.0", frozenset({
        "DFlashDraftModel", "LiLiCorrDraftModel", "MuseGlimmerAssistantModel", "DFlashMuseGlimmerAssistantModel",
        "DFlashLagunaForCausalLM"})),
    # qwen3_dflash2.py, models/beam: algos.update_dflash2 and build_vllm_speculative_config map dflash2 -> dflash
    "dflash2": VllmDraftMethod("dflash", "0.28.0", frozenset({"DFlash2DraftModel", "DFlash2BeamDraftModel"})),
    # qwen3_dspark.py, gemma4_dspark.py, deepseek_v4(1)/*/dspark.py, kimi_k3 dspark_mla.py, muse_spark dspark.py
    "dspark": VllmDraftMethod("dspark", "0.25.0", frozenset({
        "Qwen3DSparkModel", "Qwen3OmniDSparkModel", "DSparkDraftModel", "DSparkV41DraftModel", "K3DSparkModel",
        "MuseSparkDSparkModel", "Gemma4DSparkModel"})),
    # qwen3_xpress.py: XPress "serves under method=dflash" (SpeculativeConfig.is_xpress, XPRESS_ARCHITECTURES)
    "xpress": VllmDraftMethod("dflash", "0.33.0", frozenset({"Qwen3XPressModel", "DFlashQwen3XPressModel"})),
    # deepseek_mtp.py, qwen3_next_mtp.py, ...: every <model>_mtp method was folded into "mtp" (a deprecation warning
    # rewrites the old names); with no draft model vLLM reads the MTP layers from the target checkpoint itself
    "mtp": VllmDraftMethod("mtp", "0.11.0", frozenset({
        "DeepSeekMTPModel", "DeepseekV32MTPModel", "DeepSeekV4MTPModel", "MiMoMTPModel", "MiMoV2MTPModel",
        "Glm4MoeMTPModel", "Glm4MoeLiteMTPModel", "ErnieMTPModel", "Qwen3NextMTP", "Qwen3_5MTP", "Qwen3_5MoeMTP",
        "NemotronHMTPModel", "LongCatFlashMTPModel", "MiniMaxM3MTP", "Gemma4MTPModel", "Step3p5MTP"})),
    # a causal LM served as a draft model; llm_base_proposer reads pard_token when parallel_drafting is on
    "pard": VllmDraftMethod("draft_model", "0.16.0", frozenset(), (("parallel_drafting", True),)),
}
# speculators_model_type values vLLM's speculators path reads (algos.py SUPPORTED_SPECULATORS_TYPES); any other
# makes SpeculatorsConfig raise "Expected one of: ..."
VLLM_SPECULATORS_MODEL_TYPES = frozenset({"eagle3", "peagle", "dflash", "dflash2", "dspark"})
# Targets whose own checkpoint vLLM serves MTP from: hf_config_override rewrites these model types and
# architectures into an MTP draft config (the keys it reads the MTP layer count from are VLLM_MTP_COUNT_KEYS)
VLLM_MTP_TARGET_MODEL_TYPES = frozenset({
    "deepseek_v3", "deepseek_v32", "glm_moe_dsa", "deepseek_v4", "pangu_ultra_moe", "kimi_k3", "ernie4_5_moe",
    "nemotron_h", "nemotron_h_puzzle", "qwen3_next", "qwen4_exp", "qwen4_exp_text", "bailing_hybrid", "exaone_moe",
    "qwen3_5", "qwen3_5_moe", "qwen3_5_text", "qwen3_5_moe_text", "intern_s2_preview", "interns2_mobius",
    "longcat_flash", "step3p5", "step3p7", "step5", "step5_vl", "hy_v3", "hy_v4", "inkling_mm_model",
    "inkling_model", "minimax_m3_vl", "glm5_next", "dots3_note",
})
VLLM_MTP_TARGET_ARCHITECTURES = frozenset({
    "MiMoForCausalLM", "MiMoV2ForCausalLM", "MiMoV2OmniForCausalLM", "MiMoV2FlashForCausalLM", "Glm4MoeForCausalLM",
    "Glm4MoeLiteForCausalLM", "GlmOcrForConditionalGeneration", "BailingMoeV3ForCausalLM",
    "BailingMoeV3VLForConditionalGeneration", "Step3p5ForCausalLM", "Step3p7ForConditionalGeneration",
    "Step5ForCausalLM", "Step5ForConditionalGeneration", "MiniMaxM3SparseForConditionalGeneration",
})
VLLM_MTP_COUNT_KEYS = ("num_nextn_predict_layers", "mtp_num_hidden_layers", "num_mtp_modules", "num_mtp_layers")
# where MRv2 reads a block drafter's target layers, in order, and what it adds to make them hidden_states indices
# (eagle3_utils.get_eagle3_aux_layers_from_config; dspark_target_layer_ids keeps +0 only for deepseek_v41)
VLLM_TARGET_LAYER_KEYS: tuple[tuple[str, int], ...] = (
    ("eagle_aux_hidden_state_layer_ids", 0), ("dflash_config.target_layer_ids", 1), ("dspark_target_layer_ids", 1),
    ("target_layer_ids", 1), ("dflash_config.layer_ids", 0), ("eagle_config.layer_ids", 0),
)


def vllm_method_of(architectures: Any) -> str | None:
    """The method key (VLLM_DRAFT_METHODS) whose registered draft architectures include one of these."""
    if not isinstance(architectures, list):
        return None
    return next((key for key, m in VLLM_DRAFT_METHODS.items() for arch in architectures
                 if isinstance(arch, str) and arch in m.architectures), None)


def vllm_serves_mtp_of(model_type: Any, architectures: Any) -> bool:
    """Whether vLLM rewrites this target's config into an MTP draft (hf_config_override)."""
    archs = architectures if isinstance(architectures, list) else []
    return model_type in VLLM_MTP_TARGET_MODEL_TYPES or any(a in VLLM_MTP_TARGET_ARCHITECTURES for a in archs
                                                             if isinstance(a, str))


VLLM_RUNNERS = ("v1", "v2")
VLLM_V2_FOR_ALL = (0, 33, 0)
"""vLLM's V2 model runner is the default for every target from 0.33 (0.22–0.32: only for Qwen3ForCausalLM
targets, as read at 0.22). CPU builds run only V1. The runners capture different aux ids (reference §4.6)."""


def vllm_default_runner(version: Version, target_architecture: str | None) -> str:
    if version >= VLLM_V2_FOR_ALL or (version >= (0, 22, 0) and target_architecture == "Qwen3ForCausalLM"):
        return "v2"
    return "v1"


def vllm_runner_ids(view: "VllmView", runner: str) -> tuple[int, ...] | None:
    """The aux ids a runner captures for this draft (vLLM convention); None: it falls back to its default."""
    return view.top_level_ids if runner == "v2" else view.v1_ids


def vllm_rewrite_architecture(arch: str) -> str:
    """EAGLEConfig keeps names that start or end with Eagle3 and prefixes everything else (reference §4.7)."""
    return arch if arch.startswith("Eagle3") or arch.endswith("Eagle3") else "Eagle3" + arch


@dataclass(frozen=True)
class VllmView:
    """The draft config as one vLLM version resolves it: class, flags, K and the aux capture lists."""

    version: Version
    layout: str  # "flat" | "speculators"
    architecture: str | None
    model_class: str | None  # "llama" | "qwen3" | "deepseek" | None (cannot load)
    problem: str | None  # why no class was found
    config: dict[str, Any]  # after the speculators mapping, if any
    fc_norm: bool
    norm_output: bool
    norm_before_fc: bool
    norm_before_residual: bool
    use_aux_hidden_state: bool
    k: int  # fc fan-in / T as this class computes it
    k_source: str
    top_level_ids: tuple[int, ...] | None  # what the V2 runner captures (None: the default)
    v1_ids: tuple[int, ...] | None  # what the V1 runner captures (None: the default)
    v2_key: str | None = TOP_IDS  # the key the V2 runner took its ids from (None: the default)
    parallel_drafting: bool = False  # a P-EAGLE draft: served with parallel_drafting: true
    parallel_token: int | None = None  # the mask-slot token vLLM reads from the resolved config
    not_carried: tuple[str, ...] = ()  # 3.1 flags the config sets true top-level that this vLLM does not read


def _speculators_mapping(cfg: dict[str, Any], version: Version) -> tuple[dict[str, Any], str | None, str | None]:
    """vLLM's speculators/base.py + algos.update_eagle3: start from transformer_layer_config, copy a few keys."""
    tlc = cfg.get("transformer_layer_config")
    if not isinstance(tlc, dict):
        return {}, None, "speculators layout without a transformer_layer_config dict"
    if cfg.get("speculators_model_type") == "peagle":
        return _peagle_mapping(cfg, tlc, version)
    out = dict(tlc)
    for key in ("draft_vocab_size", "norm_before_fc"):
        if key in cfg:
            out[key] = cfg[key]
    if cfg.get("target_hidden_size") is not None:
        out["target_hidden_size"] = cfg["target_hidden_size"]
    out["norm_before_residual"] = cfg.get("norm_before_residual", True)
    if version >= (0, 25, 0):
        out["fc_norm"] = cfg.get("fc_norm", False)
        out["norm_output"] = cfg.get("norm_output", False)
    if cfg.get("eagle_aux_hidden_state_layer_ids"):
        out["eagle_aux_hidden_state_layer_ids"] = cfg["eagle_aux_hidden_state_layer_ids"]
    model_type = tlc.get("model_type")
    arch = SPECULATORS_ARCHITECTURES.get(model_type) if isinstance(model_type, str) else None
    if arch is None:
        return out, None, (f"vLLM's speculators path maps only transformer_layer_config.model_type llama/qwen3, "
                           f"not {model_type!r} (MLA drafts need the flat layout)")
    return out, arch, None


def _peagle_mapping(cfg: dict[str, Any], tlc: dict[str, Any], version: Version
                    ) -> tuple[dict[str, Any], str | None, str | None]:
    """algos.update_peagle: the keys it copies, its norm_before_residual default, mask_token_id as pard_token."""
    if version < VLLM_PEAGLE_SPECULATORS:
        return dict(tlc), None, (f"speculators_model_type 'peagle' is a type vLLM's speculators path knows only from "
                                 f"{'.'.join(map(str, VLLM_PEAGLE_SPECULATORS))}")
    out = dict(tlc)
    out["draft_vocab_size"] = cfg.get("draft_vocab_size")
    out["norm_before_fc"] = cfg.get("norm_before_fc", False)
    if cfg.get("target_hidden_size") is not None:
        out["target_hidden_size"] = cfg["target_hidden_size"]
    out["norm_before_residual"] = cfg.get("norm_before_residual", PEAGLE_NORM_BEFORE_RESIDUAL_DEFAULT)
    if "mask_token_id" in cfg:
        out["pard_token"] = cfg["mask_token_id"]
    if cfg.get("eagle_aux_hidden_state_layer_ids"):
        out["eagle_aux_hidden_state_layer_ids"] = cfg["eagle_aux_hidden_state_layer_ids"]
    model_type = tlc.get("model_type", "llama")
    if version < VLLM_PEAGLE_ARCH_MAP:
        return out, PEAGLE_SPECULATORS_ARCHITECTURES["llama"], None
    arch = PEAGLE_SPECULATORS_ARCHITECTURES.get(model_type) if isinstance(model_type, str) else None
    if arch is None:
        return out, None, (f"vLLM's P-EAGLE speculators path maps only transformer_layer_config.model_type "
                           f"llama/qwen3, not {model_type!r}")
    return out, arch, None


def _parallel_token(resolved: dict[str, Any]) -> int | None:
    for key in VLLM_PARALLEL_TOKEN_KEYS:
        value = as_int(resolved.get(key))
        if value is not None:
            return value
    return None


def vllm_view(spec: DraftSpec, version: Version | None = None) -> VllmView:
    version = version or parse_version(LATEST)
    cfg = spec.config
    speculators = isinstance(cfg.get("speculators_config"), dict) and cfg.get("model_type") is None
    problem = None
    if speculators:
        resolved, arch, problem = _speculators_mapping(cfg, version)
    else:
        resolved = dict(cfg)
        archs = cfg.get("architectures")
        written = archs[0] if isinstance(archs, list) and archs and isinstance(archs[0], str) else None
        if written is None:
            arch, problem = None, "config.json has no architectures list"
        elif cfg.get("model_type") == "eagle" and cfg.get("method") != "eagle3":
            arch = written if written.startswith("Eagle") else "Eagle" + written
            problem = "model_type 'eagle' takes vLLM's EAGLE-1 config path (architecture becomes " + arch + ")"
        else:
            arch = vllm_rewrite_architecture(written)
    model_class = VLLM_EAGLE3_CLASSES.get(arch) if arch and problem is None else None
    if arch and problem is None and model_class is None:
        problem = f"architecture {arch!r} (after vLLM's Eagle3 rewrite) is not a registered eagle3 model"

    ec = nested(resolved, "eagle_config")
    new = version >= (0, 22, 0)
    fc_norm = bool(resolved.get("fc_norm", False)) and new
    norm_output = bool(resolved.get("norm_output", False)) and new
    nbf = resolved.get("norm_before_fc", False)
    if new:
        nbf = ec.get("norm_before_fc", nbf)
    nbr = bool(resolved.get("norm_before_residual", False))
    top = as_ids(resolved.get("eagle_aux_hidden_state_layer_ids"))
    inner = as_ids(ec.get("eagle_aux_hidden_state_layer_ids"))
    k, k_source = _vllm_k(resolved, ec, top, inner, model_class, version)
    v1 = top if top else (inner if new else None)
    parallel = spec.facts.parallel_drafting
    not_carried = tuple(key for key in PEAGLE_NOT_CARRIED
                        if cfg.get(key) is True and not (fc_norm if key == "fc_norm" else norm_output))
    v2, v2_key = _v2_ids(resolved, top, version)
    return VllmView(
        version=version, layout="speculators" if speculators else "flat", architecture=arch,
        model_class=model_class, problem=problem, config=resolved, fc_norm=fc_norm, norm_output=norm_output,
        norm_before_fc=bool(nbf), norm_before_residual=nbr,
        use_aux_hidden_state=bool(ec.get("use_aux_hidden_state", True)),
        k=k, k_source=k_source, top_level_ids=v2, v1_ids=v1, v2_key=v2_key, parallel_drafting=parallel,
        parallel_token=_parallel_token(resolved) if parallel else None, not_carried=not_carried,
    )


def _v2_ids(resolved: dict[str, Any], top: tuple[int, ...] | None, version: Version
            ) -> tuple[tuple[int, ...] | None, str | None]:
    """What the V2 runner captures and the key it read: the top-level list, else `target_layer_ids` + 1."""
    if top:
        return top, TOP_IDS
    fallback = as_ids(resolved.get(V2_FALLBACK_IDS)) if version >= VLLM_V2_READS_TARGET_LAYER_IDS else None
    if fallback:
        return tuple(i + 1 for i in fallback), V2_FALLBACK_IDS
    return None, None


def _vllm_k(resolved: dict[str, Any], ec: dict[str, Any], top: tuple[int, ...] | None,
            inner: tuple[int, ...] | None, model_class: str | None, version: Version) -> tuple[int, str]:
    """K as the class computes it (reference §4.4): never the top-level list, except in the Qwen3 class from 0.26."""
    if version < (0, 22, 0):
        return 3, "fixed 3 before vLLM 0.22.0"
    n = as_int(resolved.get("num_aux_hidden_states"))
    if n is not None:
        return n, "num_aux_hidden_states"
    if model_class == "qwen3" and version >= (0, 26, 0):
        n = as_int(resolved.get("num_aux_layers"))
        if n is not None:
            return n, "num_aux_layers"
        if top:
            return len(top), "len(eagle_aux_hidden_state_layer_ids)"
    if inner:
        return len(inner), "len(eagle_config.eagle_aux_hidden_state_layer_ids)"
    return 3, "default 3 (no num_aux_hidden_states, no eagle_config ids)"


def vllm_requirements(spec: DraftSpec) -> list[tuple[Version, str]]:
    """Version floors of reference §11.1 that this draft needs, each with the reason."""
    cfg = spec.config
    needs: list[tuple[Version, str]] = []
    flags31 = [k for k in ("fc_norm", "norm_output") if cfg.get(k)]
    peagle_speculators = spec.facts.parallel_drafting and spec.config_layout == "speculators"
    if peagle_speculators:  # its 3.1 flags are never passed (EK330, EK331): no release to wait for
        needs.append((VLLM_PEAGLE_SPECULATORS, "speculators_model_type peagle (algos.update_peagle)"))
        if spec.attention == "qwen3":
            needs.append((VLLM_PEAGLE_ARCH_MAP, "a Qwen3 P-EAGLE in the speculators layout (PeagleQwen3ForCausalLM)"))
    elif flags31:
        needs.append(((0, 22, 0), f"EAGLE-3.1 {' + '.join(flags31)} (vLLM PR #42764)"))
    if cfg.get("fc_norm") and spec.attention == "mla":
        needs.append(((0, 23, 0), "MLA fc_norm is applied only from 0.23.0 (vLLM PR #43482)"))
    if flags31 and spec.config_layout == "speculators" and not peagle_speculators:
        needs.append(((0, 25, 0),
                      "the speculators layout passes fc_norm/norm_output only from 0.25.0 (vLLM PR #46488)"))
    if spec.num_aux_hidden_states not in (None, 3):
        needs.append(((0, 22, 0), f"K={spec.num_aux_hidden_states} aux states (fc fan-in fixed to 3·T before 0.22.0)"))
    ec = nested(cfg, "eagle_config")
    if ec.get("norm_before_fc") and not cfg.get("norm_before_fc"):
        needs.append(((0, 22, 0), "norm_before_fc read from eagle_config only from 0.22.0"))
    return needs



def speculative_config(draft: str, k: int, settings: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """vLLM's --speculative-config for an EAGLE-3 or 3.1 draft (3.1 is switched on by the draft's own config), with
    the caller's other speculative-config settings (`split_speculative_settings`)."""
    return {"model": draft, "method": "eagle3", "num_speculative_tokens": k, **(settings or {})}


# --- The speculative-config settings that change measured acceptance without changing the draft ---------------------
# Read in vllm/config/speculative.py (SpeculativeConfig) at 0.33.0 and 0.32.0; what each runner does with them in
# vllm/v1/sample/rejection_sampler.py (V1), vllm/v1/worker/gpu/spec_decode/rejection_sampler.py and
# .../spec_decode/eagle/utils.py (V2), and vllm/config/vllm.py (the V1 runner's refusals), 0.33.0. SpeculativeConfig
# forbids keys it does not know, so a release refuses a setting newer than itself (0.32.0: "Unexpected keyword
# argument" for draft_lm_head_quantization, a literal error for fly). vLLM's CPU build (0.32.0, V1 runner only) asserts
# "Synthetic acceptance not supported with CPU sampling" when it samples (vllm/utils/cpu_triton_utils.py), and FLy
# raises NotImplementedError on CPU (0.33.0); the V1 runner refuses draft_lm_head_quantization outright.
KNOBS_READ_FROM = (0, 32, 0)  # the oldest release these settings were read in: below it eaglekit leaves vLLM to judge


@dataclass(frozen=True)
class AcceptanceKnob:
    """A speculative-config setting that changes the acceptance vLLM counts, not the draft it counts it for."""

    name: str
    default: Any
    values: tuple[str, ...] | None  # what 0.33.0 accepts (None: a structured value)
    since: Version  # the oldest release read that has it (KNOBS_READ_FROM: earlier releases were not read)
    value_since: Mapping[str, Version]  # values newer than the setting


ACCEPTANCE_KNOBS: dict[str, AcceptanceKnob] = {k.name: k for k in (
    # how the target judges the drafts: standard rejection sampling, token by token; synthetic accepts at preset
    # rates whatever the draft; block verifies the k drafts jointly, lossless (V2 runner only: V1's sampler has no
    # block path and verifies token by token); fly is FLy's lossy entropy-gated deferral
    AcceptanceKnob("rejection_sample_method", "standard", ("standard", "synthetic", "block", "fly"), (0, 32, 0),
                   {"fly": (0, 33, 0)}),
    # greedy drafts the argmax, its probabilities one-hot in the ratio test at temperature > 0; probabilistic samples
    # the drafts and uses the drafter's probabilities (standard and fly only)
    AcceptanceKnob("draft_sample_method", "greedy", ("greedy", "probabilistic"), (0, 32, 0), {}),
    # the drafter proposes through an fp8 or nvfp4 copy of the target lm_head it shares and the target verifies with
    # its own, so only acceptance changes (V2 runner; methods eagle/eagle3/mtp; a drafter with its own lm_head is
    # refused: "needs a drafter that shares the target lm_head", eagle/utils.py)
    AcceptanceKnob("draft_lm_head_quantization", None, ("fp8", "nvfp4"), (0, 33, 0), {}),
    # [[batch_from, batch_to, k], ...] (inclusive ranges): k follows the batch size, so rounds of different k pool
    AcceptanceKnob("num_speculative_tokens_per_batch_size", None, None, (0, 32, 0), {}),
)}
KNOB_COMPANIONS: dict[str, Version] = {
    "synthetic_acceptance_rates": (0, 32, 0), "synthetic_acceptance_length": (0, 32, 0),
    "fly_window_size": (0, 33, 0), "fly_entropy_threshold": (0, 33, 0), "fly_entropy_top_k": (0, 33, 0),
}
"""Settings of one rejection method (vLLM refuses them under another): passed on and recorded, never judged here."""
EAGLEKIT_SETS = ("model", "method", "num_speculative_tokens")  # the speculative-config keys eaglekit writes itself
NOT_A_DRAFTERS_ACCEPTANCE: dict[str, str] = {
    "fly": "rejection_sample_method=fly is lossy (FLy accepts drafts the target's own rule rejects)",
    "synthetic": "rejection_sample_method=synthetic accepts drafts at preset rates, whatever the draft proposes",
}
"""rejection_sample_method values under which vLLM's counters measure the sampler, not the draft."""
VLLM_TAU = POOLED_TAU
"""vLLM's mean acceptance length is 1 + Σ accepted / Σ drafts over every round it counted (vllm/v1/spec_decode/
metrics.py, 0.33.0): eaglekit's pooled τ, not a mean of per-request τ."""
UNKNOWN = "unknown"


def split_speculative_settings(engine_args: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """--engine-arg pairs as (LLM(...) and server arguments, speculative-config settings): the acceptance settings
    and their companions given by name, and the keys of a `speculative_config` object, go into the speculative
    config eaglekit writes (whose draft, method and k it sets itself)."""
    llm_args, settings = {}, {}
    for key, value in engine_args.items():
        if key in ACCEPTANCE_KNOBS or key in KNOB_COMPANIONS:
            settings[key] = value
        elif key == "speculative_config":
            if not isinstance(value, dict):
                raise UsageError(f"--engine-arg speculative_config={quoted(value)}: expected a JSON object, e.g. "
                                 "speculative_config='{\"rejection_sample_method\": \"block\"}'")
            taken = [name for name in EAGLEKIT_SETS if name in value]
            if taken:
                raise UsageError(f"--engine-arg speculative_config: eaglekit sets {', '.join(taken)} itself (the "
                                 "draft, eagle3 and -k); give only the other keys")
            settings.update(value)
        else:
            llm_args[key] = value
    return llm_args, settings


def release(version: str | None) -> Version | None:
    """A vLLM version string (`0.32.0+cpu`, `0.33.1rc2.dev4`) as a release number; None when it names none."""
    found = re.match(r"^v?(\d{1,6})\.(\d{1,6})(?:\.(\d{1,6}))?", version or "")
    return (int(found.group(1)), int(found.group(2)), int(found.group(3) or 0)) if found else None


def check_speculative_settings(settings: Mapping[str, Any], version: str | None) -> None:
    """Refuse, before vLLM starts, an acceptance setting the installed release does not have or a value it does not
    take (releases read: KNOBS_READ_FROM .. LATEST; others are left to vLLM)."""
    installed = release(version)
    newest = parse_version(LATEST)[:2]
    read = installed is not None and KNOBS_READ_FROM[:2] <= installed[:2] <= newest
    for name, value in settings.items():
        knob = ACCEPTANCE_KNOBS.get(name)
        since = knob.since if knob else KNOB_COMPANIONS.get(name)
        if read and installed is not None and since is not None and installed < since:
            raise UsageError(f"--engine-arg {name}: vLLM {version} does not have it (it is new in "
                             f"{format_version(since)})")
        if knob is None or knob.values is None or value is None or (installed and installed[:2] > newest):
            continue
        if value not in knob.values:
            raise UsageError(f"--engine-arg {name}={quoted(value)}: vLLM {LATEST} takes {', '.join(knob.values)}")
        newer = knob.value_since.get(value)
        if read and installed is not None and newer is not None and installed < newer:
            raise UsageError(f"--engine-arg {name}={value}: vLLM {version} does not have it (it is new in "
                             f"{format_version(newer)})")


def acceptance_settings(settings: Mapping[str, Any] | None, *, sampled: bool = False,
                        source: str = "vLLM's defaults unless given by --engine-arg") -> dict[str, Any]:
    """The report block that says what rule vLLM's acceptance was counted under: each acceptance setting (its default
    when not given), those the caller gave, whether the counters measure the draft at all, and the labels every
    acceptance figure of the report carries. `settings` None: a server eaglekit did not start, which does not say."""
    if settings is None:
        values: dict[str, Any] = {name: UNKNOWN for name in ACCEPTANCE_KNOBS}
        return {**values, "given": {}, "source": source, "drafter_acceptance": None, "acceptance_length": VLLM_TAU,
                "labels": ["rejection_sample_method, draft_sample_method and draft_lm_head_quantization unknown: the "
                           "server does not say (vLLM shows its speculative config only at /server_info, with "
                           "VLLM_SERVER_DEV_MODE=1)"]}
    values = {name: settings.get(name, knob.default) for name, knob in ACCEPTANCE_KNOBS.items()}
    given = {name: value for name, value in settings.items() if name in ACCEPTANCE_KNOBS or name in KNOB_COMPANIONS}
    block = {**values, "given": given, "source": source,
             "drafter_acceptance": not_a_drafters_acceptance(values) is None, "acceptance_length": VLLM_TAU}
    return {**block, "labels": acceptance_labels(block, sampled=sampled)}


def describe_acceptance(block: Mapping[str, Any]) -> str:
    """One line for a report or card: τ's definition and the rule it was counted under."""
    def value(name: str) -> str:
        given = block.get(name)
        return "none" if given is None else given if isinstance(given, str) else json.dumps(given)

    shown = ", ".join(f"{name}={value(name)}" for name in ACCEPTANCE_KNOBS)
    return f"{block.get('acceptance_length', VLLM_TAU)} under {shown}"


def not_a_drafters_acceptance(block: Mapping[str, Any]) -> str | None:
    """Why acceptance counted under these settings is not the draft's own (a lossy or synthetic rejection
    sampler); None when it is the draft's, or the settings are unknown."""
    method = block.get("rejection_sample_method")
    why = NOT_A_DRAFTERS_ACCEPTANCE.get(method) if isinstance(method, str) else None
    return f"not a drafter's acceptance: {why}" if why else None


def acceptance_labels(block: Mapping[str, Any], *, sampled: bool = False) -> list[str]:
    """What every acceptance figure counted under these settings must say beside it: a rule that is not the draft's
    acceptance, one that is not comparable with the default's, a quantized draft head, a k that varies."""
    labels = [why] if (why := not_a_drafters_acceptance(block)) else []
    if block.get("rejection_sample_method") == "block":
        labels.append("rejection_sample_method=block verifies the k drafts jointly (lossless): τ is not comparable "
                      "with token-by-token verification's; vLLM's V1 runner (its CPU build) has no block verifier "
                      "and verifies token by token")
    head = block.get("draft_lm_head_quantization")
    if head not in (None, UNKNOWN):
        labels.append(f"draft_lm_head_quantization={head}: the draft proposes through a {head} copy of the target's "
                      "lm_head (the target verifies with its own): τ is this draft's with that head")
    if block.get("draft_sample_method") == "probabilistic":
        labels.append("draft_sample_method=probabilistic: drafts are sampled and the drafter's probabilities enter "
                      "the ratio test")
    elif sampled and block.get("draft_sample_method") == "greedy":
        labels.append("draft_sample_method=greedy: the drafts are the drafter's argmax, one-hot in the ratio test")
    schedule = block.get("num_speculative_tokens_per_batch_size")
    if schedule not in (None, UNKNOWN):
        labels.append(f"num_speculative_tokens_per_batch_size={json.dumps(schedule)}: k follows the batch size, so "
                      "rounds of different k are pooled")
    return labels


PARALLEL_DRAFTING_SETTING = '"parallel_drafting": true'  # a member of the --speculative-config object


def settings(spec: DraftSpec, target: TargetInfo | None = None) -> tuple[str, ...]:
    """A P-EAGLE draft is proposed in one forward only when the speculative config says so: the draft's own config
    cannot switch it on (VLLM_PARALLEL_TOKEN_KEYS' note)."""
    return (PARALLEL_DRAFTING_SETTING,) if spec.facts.parallel_drafting else ()


def serve_command(target: str, draft: str, k: int, settings: tuple[str, ...] = ()) -> str:
    """`vllm serve TARGET --speculative-config '{...}'`, each argument quoted for a POSIX shell (a path holding a
    space or a quote still names itself when pasted)."""
    import shlex

    config = speculative_config(draft, k)
    for setting in settings:  # members of the JSON object, as `settings` writes them
        config.update(json.loads("{" + setting + "}"))
    return shlex.join(["vllm", "serve", target, "--speculative-config", json.dumps(config)])


def read_ids(spec: DraftSpec, target: TargetInfo | None) -> IdReading:
    """The list the default runner of the latest release captures: top-level first, eagle_config's for V1 only."""
    view = vllm_view(spec)
    runner = vllm_default_runner(view.version, target.architectures[0] if target and target.architectures else None)
    read = vllm_runner_ids(view, runner)
    key = None if read is None else view.v2_key if runner == "v2" else TOP_IDS if view.v2_key == TOP_IDS else NESTED_IDS
    shift = 1 if key == V2_FALLBACK_IDS else 0
    return IdReading(VLLM, key, shift, read or (target.default_aux_ids if target is not None else None), None)


RECORD = Engine(
    name=VLLM, label="vLLM", latest=LATEST, oldest=VLLM_OLDEST_KNOWN, loads="safetensors", dialect="vllm",
    rules_module="eaglekit.rules.engine_vllm", requirements=vllm_requirements, serve=serve_command,
    settings=settings, read_ids=read_ids,
)


# Tensor parallelism: ModelConfig.verify_with_parallel_config (vllm/config/model.py, 0.32.0) raises "Total number of
# attention heads (H) must be divisible by tensor parallel size (N)." once the engine has started.
def tensor_parallel_refusal(target: TargetInfo, tensor_parallel_size: int) -> str | None:
    """Why vLLM refuses to split `target` over `tensor_parallel_size` ranks (None: it does not), said before it
    starts."""
    heads = target.num_attention_heads
    if heads is None or tensor_parallel_size <= 1 or heads % tensor_parallel_size == 0:
        return None
    sizes = [n for n in range(2, heads + 1) if heads % n == 0][:4]
    return (f"--tensor-parallel-size {tensor_parallel_size}: the target has {heads} attention heads, which vLLM "
            f"splits evenly over the ranks; sizes that divide them: 1, {', '.join(map(str, sizes))}")


# The CPU build's OpenMP thread binding: OMPProcessManager (vllm/utils/ompmultiprocessing.py, 0.32.0) reads
# VLLM_CPU_OMP_THREADS_BIND (vllm/envs.py: default "auto"). "auto" gives local rank r the CPUs of the r-th memory
# node the process may use (/proc/self/status Mems_allowed_list, narrowed by CPU_VISIBLE_MEMORY_NODES,
# vllm/utils/cpu_resource_utils.py) and asserts "Not enough allowed NUMA nodes to bind threads of N local
# CPUWorkers" when there are fewer nodes than local ranks; "nobind" leaves threads alone; anything else is one CPU
# list per local rank ("0-3,8"), separated by "|", and must hold exactly as many lists as local ranks.
# VLLM_CPU_SIM_MULTI_NUMA (any value but "0") splits the CPUs itself and asserts "auto".
CPU_THREADS_BIND = "VLLM_CPU_OMP_THREADS_BIND"
CPU_THREADS_AUTO = "auto"
CPU_THREADS_SEPARATOR = "|"
CPU_SIMULATED_NODES = "VLLM_CPU_SIM_MULTI_NUMA"
CPU_VISIBLE_MEMORY_NODES = "CPU_VISIBLE_MEMORY_NODES"


def cpu_threads_bind(cpus: list[int], memory_nodes: int, ranks: int, environ: Mapping[str, str]) -> str | None:
    """The VLLM_CPU_OMP_THREADS_BIND a CPU run of `ranks` local ranks needs, or None where vLLM's own "auto"
    binding works (a memory node per rank) or the user has chosen (the variable, or simulated nodes, is set).
    `cpus` are the CPU ids the process may run on; with at least one per rank each rank gets a contiguous share of
    its own, else rank r shares CPU cpus[r mod len(cpus)] with others."""
    if CPU_THREADS_BIND in environ or environ.get(CPU_SIMULATED_NODES, "0") != "0" or not cpus:
        return None
    if ranks <= max(1, memory_nodes):
        return None
    ordered = sorted(set(cpus))
    if len(ordered) < ranks:
        return CPU_THREADS_SEPARATOR.join(str(ordered[r % len(ordered)]) for r in range(ranks))
    share, extra = divmod(len(ordered), ranks)
    lists, start = [], 0
    for r in range(ranks):
        end = start + share + (1 if r < extra else 0)
        lists.append(_cpu_list(ordered[start:end]))
        start = end
    return CPU_THREADS_SEPARATOR.join(lists)


def _cpu_list(ids: list[int]) -> str:
    """Ascending CPU ids in vLLM's list syntax: runs as ranges ("0-3,8")."""
    runs: list[list[int]] = []
    for i in ids:
        if runs and i == runs[-1][-1] + 1:
            runs[-1].append(i)
        else:
            runs.append([i])
    return ",".join(str(run[0]) if len(run) == 1 else f"{run[0]}-{run[-1]}" for run in runs)
