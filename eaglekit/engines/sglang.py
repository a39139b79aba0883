"""What SGLang 0.5.23 (the only release modelled) reads from an EAGLE-3 draft: K and the capture list, with its
shift rules (reference §5.1); nothing of norm_before_residual."""

from __future__ import annotations

from dataclasses import dataclass

from eaglekit.config_view import as_ids, as_int, nested
from eaglekit.engines.base import NESTED_IDS, Engine, IdReading, single_release_requirements
from eaglekit.spec import DraftSpec
from eaglekit.target import TargetInfo

SGLANG = "sglang"
LATEST = "0.5.23"
DEEPSEEK_TARGET_TYPES = ("deepseek_v2", "deepseek_v3", "deepseek_v32", "kimi_k2", "kimi_k25")


@dataclass(frozen=True)
class SglangView:
    """What SGLang 0.5.23 reads: K, the capture list (its shift rules, reference §5.1) and nothing of
    norm_before_residual."""

    k: int
    k_source: str
    eagle_config_ids: tuple[int, ...] | None
    deepseek_target: bool


def sglang_view(spec: DraftSpec, target: TargetInfo | None = None) -> SglangView:
    cfg = spec.config
    ec = nested(cfg, "eagle_config")
    inner = as_ids(ec.get("eagle_aux_hidden_state_layer_ids"))
    top = as_ids(cfg.get("eagle_aux_hidden_state_layer_ids"))
    if spec.attention == "mla":
        if inner:
            k, src = len(inner), "len(eagle_config.eagle_aux_hidden_state_layer_ids)"
        elif top:
            k, src = len(top), "len(eagle_aux_hidden_state_layer_ids)"
        else:
            k, src = 3, "default 3"
    else:
        n = as_int(cfg.get("num_aux_hidden_states"))
        if n is not None:
            k, src = n, "num_aux_hidden_states"
        elif inner:
            k, src = len(inner), "len(eagle_config.eagle_aux_hidden_state_layer_ids)"
        else:
            k, src = 3, "default 3"
    if target is not None and target.model_type:
        deepseek = target.model_type in DEEPSEEK_TARGET_TYPES
    else:
        deepseek = spec.attention == "mla"
    return SglangView(k, src, inner, deepseek)


def sglang_capture(view: SglangView, target: TargetInfo | None) -> tuple[int, ...] | None:
    """The layers SGLang captures, in vLLM convention (input-of-layer); None when it needs the target's L."""
    ids = view.eagle_config_ids
    if ids is None:
        return target.default_aux_ids if target is not None else None
    if view.deepseek_target and ids[0] != 1:
        return ids  # SGLang PR #25454: shift only when the first id is 1
    return tuple(i + 1 for i in ids)


def serve_command(target: str, draft: str, k: int, settings: tuple[str, ...] = ()) -> str:
    return (f"python -m sglang.launch_server --model {target} --speculative-algorithm EAGLE3 "
            f"--speculative-draft-model-path {draft} --speculative-num-steps {k} --speculative-eagle-topk 1 "
            f"--speculative-num-draft-tokens {k + 1}")


def read_ids(spec: DraftSpec, target: TargetInfo | None) -> IdReading:
    """eagle_config's list, shifted by one unless the DeepSeek rule keeps it."""
    view = sglang_view(spec, target)
    captured = sglang_capture(view, target)
    inner = view.eagle_config_ids
    shift = 1 if inner and captured is not None and captured[0] == inner[0] + 1 else 0
    return IdReading(SGLANG, NESTED_IDS if inner else None, shift, captured, None)


RECORD = Engine(
    name=SGLANG, label="SGLang", latest=LATEST, oldest=LATEST, loads="safetensors", dialect="sglang",
    rules_module="eaglekit.rules.engine_sglang",
    requirements=single_release_requirements(LATEST, "EAGLE-3.1 in the Llama and MLA drafts"),
    serve=serve_command, read_ids=read_ids,
)
