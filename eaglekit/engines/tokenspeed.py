"""What tokenspeed reads from an EAGLE-3 draft, as read at 0.1.0 (lightseekorg/tokenspeed).

`runtime/execution/factory.py` takes the capture ids from `--eagle3-layers-to-capture`, else from the draft
config: `eagle_config`'s list when an eagle_config exists (the top-level list is then never read), else the
top-level list, else `text_config`'s. Llama and DeepSeek targets capture the state after layer id (index id + 1,
an output-of-layer reading); Kimi-K3 targets read the ids unchanged. The Llama draft (`llama_eagle3.py`) sizes
`fc` as hidden_size x K with K = len(top-level ids) (else 3), reads fc_norm, norm_before_fc and norm_output at the
top level only (both norms apply when both are set) and has exactly one layer. The MLA draft sizes `fc` by
target_hidden_size and takes K from the nested list first.
"""

from __future__ import annotations

from dataclasses import dataclass

from eaglekit.config_view import as_ids, nested
from eaglekit.engines.base import Engine, IdReading, single_release_requirements
from eaglekit.spec import DraftSpec
from eaglekit.target import TargetInfo

TOKENSPEED = "tokenspeed"
LATEST = "0.1.0"
ARCHITECTURES = ("LlamaForCausalLMEagle3", "Eagle3DeepseekV2ForCausalLM")
UNSHIFTED_TARGET_TYPES = ("kimi_k3",)
DEFAULT_K = 3


@dataclass(frozen=True)
class TokenspeedView:
    """What tokenspeed reads from a draft: the aux ids it captures, K and the flags its draft class uses."""

    ids: tuple[int, ...] | None  # the list it reads, as written (None: its default)
    ids_key: str | None
    shifted: bool  # +1 on read (output-of-layer)
    k: int  # fc fan-in / width as its draft class computes it
    k_source: str
    architecture: str | None
    fc_norm: bool
    norm_before_fc: bool
    norm_output: bool
    norm_output_ignored: bool  # only eagle_config.return_hidden_post_norm, which it never reads


def tokenspeed_view(spec: DraftSpec, target: TargetInfo | None = None) -> TokenspeedView:
    cfg = spec.config
    ec = nested(cfg, "eagle_config")
    key: str | None
    if "eagle_config" in cfg and isinstance(cfg["eagle_config"], dict):
        ids, key = as_ids(ec.get("eagle_aux_hidden_state_layer_ids")), "eagle_config.eagle_aux_hidden_state_layer_ids"
    elif as_ids(cfg.get("eagle_aux_hidden_state_layer_ids")):
        ids, key = as_ids(cfg.get("eagle_aux_hidden_state_layer_ids")), "eagle_aux_hidden_state_layer_ids"
    else:
        ids = as_ids(nested(cfg, "text_config").get("eagle_aux_hidden_state_layer_ids"))
        key = "text_config.eagle_aux_hidden_state_layer_ids" if ids else None
    top = as_ids(cfg.get("eagle_aux_hidden_state_layer_ids"))
    if spec.attention == "mla":
        inner = as_ids(ec.get("eagle_aux_hidden_state_layer_ids"))
        if inner:
            k, k_source = len(inner), "len(eagle_config.eagle_aux_hidden_state_layer_ids)"
        elif top:
            k, k_source = len(top), "len(eagle_aux_hidden_state_layer_ids)"
        else:
            k, k_source = DEFAULT_K, "default 3"
    elif top:
        k, k_source = len(top), "len(eagle_aux_hidden_state_layer_ids)"
    else:
        k, k_source = DEFAULT_K, "default 3 (no top-level eagle_aux_hidden_state_layer_ids)"
    archs = cfg.get("architectures")
    arch = archs[0] if isinstance(archs, list) and archs and isinstance(archs[0], str) else None
    model_type = target.model_type if target is not None else None
    norm_output = cfg.get("norm_output") is True
    return TokenspeedView(
        ids=ids, ids_key=key, shifted=model_type not in UNSHIFTED_TARGET_TYPES, k=k, k_source=k_source,
        architecture=arch, fc_norm=cfg.get("fc_norm") is True, norm_before_fc=cfg.get("norm_before_fc") is True,
        norm_output=norm_output, norm_output_ignored=not norm_output and ec.get("return_hidden_post_norm") is True,
    )


def tokenspeed_capture(view: TokenspeedView, target: TargetInfo | None) -> tuple[int, ...] | None:
    """The layers it captures without the flag, in vLLM convention; None when that needs the target's L."""
    if view.ids is None:
        return target.default_aux_ids if target is not None else None
    return tuple(i + 1 for i in view.ids) if view.shifted else view.ids


def capture_flag_value(ids: tuple[int, ...], shifted: bool = True) -> str | None:
    """`--eagle3-layers-to-capture` for layers `ids` (vLLM convention); None when it cannot express them."""
    written = [i - 1 for i in ids] if shifted else list(ids)
    return ",".join(str(i) for i in written) if min(written) >= 0 else None


def settings(spec: DraftSpec, target: TargetInfo | None = None) -> tuple[str, ...]:
    """The capture flag, when its reading of the config differs from the layers the draft was trained on, or
    cannot be told without the target."""
    ids = spec.aux.ids
    if not ids:
        return ()
    target = target or spec.target
    view = tokenspeed_view(spec, target)
    captured = tokenspeed_capture(view, target)
    if captured is not None and sorted(set(captured)) == sorted(set(ids)):
        return ()
    value = capture_flag_value(ids, view.shifted)
    return (f"--eagle3-layers-to-capture {value}",) if value else ()


def serve_command(target: str, draft: str, k: int, settings: tuple[str, ...] = ()) -> str:
    return " ".join([f"tokenspeed serve {target} --speculative-algorithm EAGLE3 --speculative-draft-model-path "
                     f"{draft} --speculative-num-steps {k} --speculative-eagle-topk 1 "
                     f"--speculative-num-draft-tokens {k + 1}", *settings])


def read_ids(spec: DraftSpec, target: TargetInfo | None) -> IdReading:
    view = tokenspeed_view(spec, target)
    return IdReading(TOKENSPEED, view.ids_key, 1 if view.shifted else 0, tokenspeed_capture(view, target),
                     "--eagle3-layers-to-capture")


RECORD = Engine(
    name=TOKENSPEED, label="tokenspeed", latest=LATEST, oldest=LATEST, loads="safetensors", dialect="vllm",
    rules_module="eaglekit.rules.engine_tokenspeed",
    requirements=single_release_requirements(LATEST, f"EAGLE-3.1 as read at {LATEST}"),
    serve=serve_command, settings=settings, read_ids=read_ids,
)
