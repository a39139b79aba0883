"""What every layout module shares: the observed signals and the builder of a DraftSpec."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from eaglekit.config_view import as_ids, as_int, config_problems, flag_at, int_at, nested, number_at
from eaglekit.engines.base import TOP_IDS
from eaglekit.errors import CheckpointError, NotEagle3DraftError
from eaglekit.families.names import FC_NORM, canonical_name, layer_index, name_forms
from eaglekit.io.checkpoint import CheckpointFiles
from eaglekit.io.dtypes import FLOAT_DTYPES
from eaglekit.spec import (
    Attention,
    AuxLayers,
    DraftSpec,
    Flags,
    Geometry,
    IdConvention,
    IdLocation,
    MlaGeometry,
    SourceFacts,
    TensorRef,
    VocabMap,
)

if TYPE_CHECKING:
    from eaglekit.other_drafts import OtherDraft

MAX_DRAFT_LAYERS = 1024  # drafts have 1..8 layers; an index past this would only make every layer check huge
MODELOPT_EAGLE_KEYS = (
    "use_input_layernorm_in_first_layer", "use_last_layernorm", "use_mtp_layernorm",
    "next_layer_regular", "parallel_draft_step", "parallel_draft_heads_num_layers",
)


@dataclass
class Observed:
    """Signals a layout module can test without looking at tensor values."""

    files: CheckpointFiles
    config: dict[str, Any]
    names: list[str]  # source tensor names
    forms: set[str]
    metadata: dict[str, str]

    @classmethod
    def from_files(cls, files: CheckpointFiles, names: list[str] | None = None) -> "Observed":
        """`names`: a full model's tensor names read from its index alone (its headers are never read)."""
        names = sorted(files.entries if names is None else names)
        return cls(files, files.config, names, name_forms(names), files.metadata)

    @property
    def architecture(self) -> str:
        archs = self.config.get("architectures") or []
        return archs[0] if isinstance(archs, list) and archs else ""

    @property
    def eagle_config(self) -> dict[str, Any]:
        return nested(self.config, "eagle_config")

    @property
    def speculators_layout(self) -> bool:
        return isinstance(self.config.get("speculators_config"), dict)

    @property
    def layer_config(self) -> dict[str, Any]:
        """Where the decoder geometry lives: transformer_layer_config for speculators, else the top level."""
        tlc = self.config.get("transformer_layer_config")
        return tlc if self.speculators_layout and isinstance(tlc, dict) else self.config

    def has(self, canonical_suffix: str) -> bool:
        return any(canonical_name(n).endswith(canonical_suffix) for n in self.names)

    def has_exact(self, canonical: str) -> bool:
        return any(canonical_name(n) == canonical for n in self.names)

    @property
    def is_mla(self) -> bool:
        return self.has("self_attn.kv_a_proj_with_mqa.weight") or self.has("self_attn.q_a_proj.weight")

    @property
    def torchspec_marker(self) -> bool:
        return "torchspec_version" in self.metadata or "_torchspec_version" in self.config


@dataclass(frozen=True)
class Traits:
    """What a layout reader knows about its producer."""

    producer: str
    aux_convention: IdConvention | None  # None: decide by heuristic
    aux_keys: tuple[IdLocation, ...] = ("top-level", "eagle_config")  # where the producer writes ids, in read order
    norm_before_residual_default: bool | None = None  # what the producer's consumer assumed when absent
    notes: tuple[str, ...] = field(default_factory=tuple)
    # quirks the rules read by name (never by family string)
    trained_on_default_ids: bool = False  # the producer hard-wires (2, L//2, L-3): a missing id list means those
    empty_ids_mean_default: bool = False  # the producer writes [] when it trained on its default ids (ModelOpt)
    norm_before_residual_forced: bool = False  # the converter writes true whatever training used (P12)
    norm_output_meaning_versioned: bool = False  # norm_output meant another recurrence in older releases (P35)
    hidden_norm_is_input_norm: bool = False  # layers >= 1 store their input norm as hidden_norm (P32)
    vllm_layout: bool = False  # vLLM's own flat layout, as upgrade writes it: trained tensors can be written back as is
    parallel_drafting: bool = False  # P-EAGLE: trained for parallel drafting (served with parallel_drafting: true)
    aux_ids_key: str = TOP_IDS  # the top-level key the producer writes its aux ids under (eagle_config: always TOP_IDS)
    family: str = ""  # filled in from the registered name by detection


@dataclass(frozen=True)
class Family:
    """One producer's layout: how to recognise its checkpoints, and what they mean."""

    name: str
    priority: int  # lower is tried first
    matches: Callable[[Observed], bool]
    traits: Callable[[Observed], Traits]
    describe: Callable[[Observed], OtherDraft] | None = None  # a draft of another speculative method

    @property
    def is_eagle3(self) -> bool:
        return self.describe is None


FAMILIES: dict[str, Family] = {}


def family(name: str, priority: int, traits: Traits | None = None):
    """Register a layout reader: a class with a static `matches(obs)`, and either the producer's `traits` here or a
    static `traits(obs)` when they depend on the checkpoint. A class with a static `describe(obs)` instead is a
    draft of another speculative method: recognised and described, never read as EAGLE-3 (its traits refuse)."""
    def register(cls):
        if name in FAMILIES:
            raise ValueError(f"family {name!r} registered twice")
        describe = getattr(cls, "describe", None)
        if describe is not None:
            FAMILIES[name] = Family(name, priority, cls.matches, _refusal(describe), describe)
        else:
            FAMILIES[name] = Family(name, priority, cls.matches, cls.traits if traits is None else lambda obs: traits)
        return cls
    return register


def _refusal(describe: Callable[[Observed], OtherDraft]) -> Callable[[Observed], Traits]:
    def traits(obs: Observed) -> Traits:
        raise NotEagle3DraftError(describe(obs), obs.files.root)
    return traits


def read_aux(obs: Observed, traits: Traits) -> AuxLayers:
    places = {"top-level": obs.config, "eagle_config": obs.eagle_config}
    if traits.empty_ids_mean_default:  # "use the defaults", as the producer's export template writes it
        places = {p: _without_empty_ids(cfg) for p, cfg in places.items()}
    keys = {"top-level": traits.aux_ids_key, "eagle_config": TOP_IDS}
    top, nested = (as_ids(places[p].get(keys[p])) for p in ("top-level", "eagle_config"))
    written = None
    location: IdLocation | None = None
    for key in traits.aux_keys:
        candidate = top if key == "top-level" else nested
        if candidate is not None:
            written, location = candidate, key
            break
    if written is not None and top is not None and nested is not None:
        location = "both"
    where = f"top-level {traits.aux_ids_key}" if traits.aux_ids_key != TOP_IDS and location == "top-level" else location
    if written is None:
        unreadable = [p for p in traits.aux_keys if places[p].get(keys[p]) is not None]
        if unreadable:  # written, but not as layer ids: reported (EK157), never read as "not recorded"
            return AuxLayers(None, None, None, False, unreadable[0], f"{unreadable[0]}, not a list of layer ids")
        return AuxLayers(None, None, None, False, None, "not recorded in the checkpoint")

    convention, known = traits.aux_convention, traits.aux_convention is not None
    if convention is None:
        if written[0] == 1:
            convention = "output"
        elif written[0] == 2:
            convention = "input"
    if convention is None:
        return AuxLayers(None, written, None, False, location, f"{where} (convention unknown)")
    ids = tuple(i + 1 for i in written) if convention == "output" else written
    how = f"{traits.producer} convention" if known else "heuristic: first id " + str(written[0])
    return AuxLayers(ids, written, convention, known, location, f"{where}, {convention}-of-layer ({how})")


def _without_empty_ids(cfg: dict[str, Any]) -> dict[str, Any]:
    if cfg.get("eagle_aux_hidden_state_layer_ids") == []:
        return {k: v for k, v in cfg.items() if k != "eagle_aux_hidden_state_layer_ids"}
    return cfg


def read_tensors(obs: Observed, traits: Traits) -> tuple[dict[str, TensorRef], list[int], list[int]]:
    """Canonical name -> byte range; the decoder layers that have tensors; layers whose hidden_norm was renamed."""
    files = obs.files
    tensors: dict[str, TensorRef] = {}
    for src in obs.names:
        rel, entry = files.entries[src]
        canon = canonical_name(src)
        if canon in tensors:
            raise CheckpointError(f"tensors {tensors[canon].source_name!r} and {src!r} map to the same name "
                                  f"{canon!r}", files.root)
        tensors[canon] = TensorRef(canon, src, rel, entry.dtype, entry.shape, entry.start, entry.end)

    layer_ids = sorted({i for n in tensors if (i := layer_index(n)) is not None})
    if layer_ids and layer_ids[-1] >= MAX_DRAFT_LAYERS:
        raise CheckpointError(f"a tensor names decoder layer {layer_ids[-1]}; a draft has at most {MAX_DRAFT_LAYERS} "
                              "layers, so this is not a draft checkpoint", files.root)
    renamed_hidden_norm: list[int] = []
    for i in layer_ids:  # ModelOpt Megatron: layers >= 1 store their input norm as hidden_norm (P32)
        hidden_norm, input_norm = f"layers.{i}.hidden_norm.weight", f"layers.{i}.input_layernorm.weight"
        if i >= 1 and hidden_norm in tensors and input_norm not in tensors:
            if traits.hidden_norm_is_input_norm:
                ref = tensors.pop(hidden_norm)
                tensors[input_norm] = TensorRef(input_norm, ref.source_name, ref.file, ref.dtype, ref.shape,
                                                ref.data_start, ref.data_end)
                renamed_hidden_norm.append(i)
    return tensors, layer_ids, renamed_hidden_norm


def attention_kind(obs: Observed, tensors: dict[str, TensorRef]) -> Attention:
    if obs.is_mla:
        return "mla"
    qk_norm = any(n.endswith(("self_attn.q_norm.weight", "self_attn.k_norm.weight")) for n in tensors)
    return "qwen3" if qk_norm else "llama"


@dataclass(frozen=True)
class GeometryReading:
    """The geometry (the tensors win over the config), K, and what the config itself wrote about them."""

    geometry: Geometry
    k: int | None
    fc_in: int | None
    fc_norm_ids: tuple[int, ...]
    config_hidden_size: int | None
    config_num_layers: int | None
    config_k: int | None
    config_target_hidden_size: int | None
    rope_theta_written: bool


def read_geometry(obs: Observed, tensors: dict[str, TensorRef], layer_ids: list[int],
                  attention: str) -> GeometryReading:
    files, cfg, lcfg = obs.files, obs.config, obs.layer_config

    def shape(name: str) -> tuple[int, ...] | None:
        return tensors[name].shape if name in tensors else None

    cfg_h = int_at(lcfg, "hidden_size")
    h = None
    for probe in ("norm.weight", "layers.0.input_layernorm.weight", "layers.0.hidden_norm.weight"):
        norm = shape(probe)
        if norm and len(norm) == 1:
            h = norm[0]
            break
    fc = shape("fc.weight")
    if h is None and fc:
        h = fc[0]
    h = h or cfg_h
    if h is None:
        raise CheckpointError("cannot determine hidden_size: no norm or fc tensors and no config value",
                              files.config_path)

    cfg_layers = int_at(lcfg, "num_hidden_layers")
    num_layers = (max(layer_ids) + 1) if layer_ids else (cfg_layers or 0)

    fc_norm_ids = sorted(int(m.group(1)) for n in tensors if (m := FC_NORM.match(n)))
    t_cfg = int_at(cfg, "target_hidden_size")
    k_cfg = int_at(cfg, "num_aux_hidden_states") or int_at(lcfg, "num_aux_hidden_states")
    fc_in = fc[1] if fc and len(fc) == 2 else None
    first_fc_norm = shape(f"fc_norm.{fc_norm_ids[0]}.weight") if fc_norm_ids else None
    if first_fc_norm:
        t = first_fc_norm[0]
    else:
        t = t_cfg or h
    k = None
    if fc_in is not None and t:
        k = fc_in // t if fc_in % t == 0 else None
    if k is None:
        k = k_cfg

    n_heads = int_at(lcfg, "num_attention_heads") or 0
    n_kv = int_at(lcfg, "num_key_value_heads") or n_heads
    head_dim = int_at(lcfg, "head_dim") or (h // n_heads if n_heads else 0)
    gate = shape("layers.0.mlp.gate_proj.weight")
    inter = gate[0] if gate else (int_at(lcfg, "intermediate_size") or 0)
    mla = _mla_geometry(shape, lcfg) if attention == "mla" else None
    rope_scaling, theta_home = _rope_reading(lcfg)
    rope_theta_written = theta_home.get("rope_theta") is not None
    sliding = int_at(lcfg, "sliding_window") if lcfg.get("use_sliding_window", "layer_types" in lcfg) else None
    geometry = Geometry(
        hidden_size=h,
        target_hidden_size=t,
        intermediate_size=inter,
        num_layers=num_layers,
        num_heads=n_heads,
        num_kv_heads=n_kv,
        head_dim=head_dim,
        rms_norm_eps=number_at(lcfg, "rms_norm_eps", 1e-6),
        rope_theta=number_at(theta_home, "rope_theta", 10000.0),
        rope_scaling=rope_scaling,
        max_position_embeddings=int_at(lcfg, "max_position_embeddings"),
        attention_bias=bool(lcfg.get("attention_bias", False)),
        sliding_window=sliding,
        mla=mla,
    )
    return GeometryReading(geometry, k, fc_in if t else None, tuple(fc_norm_ids), cfg_h, cfg_layers, k_cfg, t_cfg,
                           rope_theta_written)


def _mla_geometry(shape: Callable[[str], tuple[int, ...] | None], lcfg: dict[str, Any]) -> MlaGeometry:
    """The MLA projection ranks: from the tensors' shapes where they show, else from the config."""
    qa = shape("layers.0.self_attn.q_a_proj.weight")
    kva = shape("layers.0.self_attn.kv_a_proj_with_mqa.weight")
    rope_dim = int_at(lcfg, "qk_rope_head_dim") or 64
    return MlaGeometry(
        q_lora_rank=qa[0] if qa else int_at(lcfg, "q_lora_rank"),
        kv_lora_rank=(kva[0] - rope_dim) if kva else (int_at(lcfg, "kv_lora_rank") or 0),
        qk_nope_head_dim=int_at(lcfg, "qk_nope_head_dim") or 0,
        qk_rope_head_dim=rope_dim,
        v_head_dim=int_at(lcfg, "v_head_dim") or 0,
    )


def _rope_reading(lcfg: dict[str, Any]) -> tuple[dict[str, Any] | None, dict[str, Any]]:
    """The rope scaling and the mapping that holds rope_theta, wherever the config writes them: at the top level,
    or inside rope_parameters (where a non-default rope_type is the scaling)."""
    rope_scaling = lcfg.get("rope_scaling") if isinstance(lcfg.get("rope_scaling"), dict) else None
    rope_params = lcfg.get("rope_parameters") if isinstance(lcfg.get("rope_parameters"), dict) else None
    theta_home = lcfg if lcfg.get("rope_theta") is not None else (rope_params or {})
    if rope_scaling is None and rope_params and rope_params.get("rope_type", "default") != "default":
        rope_scaling = {k: v for k, v in rope_params.items() if k != "rope_theta"}
    return rope_scaling, theta_home


def read_vocabulary(obs: Observed, tensors: dict[str, TensorRef]) -> tuple[VocabMap, int | None, int | None]:
    """V and Vd (the tensors win), with the config's own vocab_size and draft_vocab_size."""
    cfg, lcfg = obs.config, obs.layer_config
    v_cfg = int_at(lcfg, "vocab_size") or int_at(cfg, "vocab_size")
    embed = tensors["embed_tokens.weight"].shape if "embed_tokens.weight" in tensors else None
    head = tensors["lm_head.weight"].shape if "lm_head.weight" in tensors else None
    d2t = tensors["d2t"].shape if "d2t" in tensors else None
    vd_cfg = int_at(cfg, "draft_vocab_size") or int_at(lcfg, "draft_vocab_size")
    vd = head[0] if head else (d2t[0] if d2t else (vd_cfg or v_cfg or 0))
    vocab = VocabMap(vocab_size=embed[0] if embed else v_cfg, draft_vocab_size=vd, has_d2t="d2t" in tensors,
                     has_t2d="t2d" in tensors)
    return vocab, v_cfg, vd_cfg


def read_flags(obs: Observed) -> Flags:
    """The EAGLE-3.1 and norm flags as written (norm_before_fc: eagle_config first). A value that is not a JSON
    boolean reads as not written here and is reported by `config_problems`."""
    cfg, ec = obs.config, obs.eagle_config
    nbf = flag_at(ec, "norm_before_fc")
    return Flags(
        fc_norm=bool(flag_at(cfg, "fc_norm") or flag_at(cfg, "use_aux_norm")),
        norm_output=bool(flag_at(cfg, "norm_output")),
        norm_before_fc=bool(flag_at(cfg, "norm_before_fc") if nbf is None else nbf),
        norm_before_residual=flag_at(cfg, "norm_before_residual"),
    )


PARALLEL_TOKEN_KEYS = ("mask_token_id", "pard_token")
"""Where a parallel-drafting draft names the token of its mask slots: speculators writes mask_token_id, vLLM's
speculators mapping turns it into pard_token (the flat layout may hold either; vLLM reads mask_token_id first)."""


def parallel_token_id(cfg: dict[str, Any]) -> int | None:
    for key in PARALLEL_TOKEN_KEYS:
        value = as_int(cfg.get(key))
        if value is not None:
            return value
    return None


def build_spec(obs: Observed, traits: Traits) -> DraftSpec:
    """The canonical description, from the small readers above and the family's traits."""
    files, cfg = obs.files, obs.config
    tensors, layer_ids, renamed_hidden_norm = read_tensors(obs, traits)
    attention = attention_kind(obs, tensors)
    g = read_geometry(obs, tensors, layer_ids, attention)
    vocab, v_cfg, vd_cfg = read_vocabulary(obs, tensors)
    facts = SourceFacts(
        tensor_layer_ids=tuple(layer_ids),
        renamed_hidden_norm_layers=tuple(renamed_hidden_norm),
        fc_in_features=g.fc_in,
        fc_norm_tensor_ids=g.fc_norm_ids,
        config_hidden_size=g.config_hidden_size,
        config_num_layers=g.config_num_layers,
        config_num_aux_hidden_states=g.config_k,
        config_vocab_size=v_cfg,
        config_draft_vocab_size=vd_cfg,
        target_hidden_size_written=g.config_target_hidden_size is not None,
        rope_theta_written=g.rope_theta_written,
        norm_output_written="norm_output" in cfg,
        norm_before_residual_default=traits.norm_before_residual_default,
        trained_on_default_ids=traits.trained_on_default_ids,
        norm_before_residual_forced=traits.norm_before_residual_forced,
        norm_output_meaning_versioned=traits.norm_output_meaning_versioned,
        vllm_layout=traits.vllm_layout,
        parallel_drafting=traits.parallel_drafting,
        mask_token_id=parallel_token_id(cfg) if traits.parallel_drafting else None,
        config_problems=config_problems(cfg, obs.layer_config, empty_ids_allowed=traits.empty_ids_mean_default,
                                        own_id_key=traits.aux_ids_key),
        aux_ids_key=traits.aux_ids_key,
    )
    dtypes = Counter(t.dtype for t in tensors.values() if t.dtype in FLOAT_DTYPES)
    return DraftSpec(
        path=files.root,
        files=list(files.weight_files),
        family=traits.family,
        producer=traits.producer,
        attention=attention,
        architectures=[a for a in cfg["architectures"] if isinstance(a, str)]
        if isinstance(cfg.get("architectures"), list) else [],
        model_type=cfg.get("model_type") if isinstance(cfg.get("model_type"), str) else None,
        config_layout="speculators" if obs.speculators_layout else "flat",
        geometry=g.geometry,
        num_aux_hidden_states=g.k,
        aux=read_aux(obs, traits),
        vocab=vocab,
        flags=read_flags(obs),
        has_embed_tokens="embed_tokens.weight" in tensors,
        has_lm_head="lm_head.weight" in tensors,
        dtype=dtypes.most_common(1)[0][0] if dtypes else "F32",
        tensors=tensors,
        config=cfg,
        metadata=dict(files.metadata),
        facts=facts,
    )
