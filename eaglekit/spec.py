"""The canonical description of a draft: every layout reads into it, every writer reads out of it."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from typing import Any, Literal

from eaglekit.config_view import ConfigProblem
from eaglekit.io.dtypes import element_count
from eaglekit.target import TargetInfo

Attention = Literal["llama", "qwen3", "mla"]
ATTENTION_KINDS: tuple[Attention, ...] = ("llama", "qwen3", "mla")
ConfigLayout = Literal["flat", "speculators"]
IdConvention = Literal["input", "output"]  # input of layer i (vLLM, HF hidden_states index) | output of layer i
IdLocation = Literal["top-level", "eagle_config", "both", "default", "argument"]
VocabOrder = Literal["sorted", "frequency"]
EagleVersion = Literal["3", "3.1", "3.1-partial"]


@dataclass(frozen=True)
class TensorRef:
    """Where one tensor of the draft lives on disk, under its canonical name."""

    name: str
    source_name: str
    file: str
    dtype: str
    shape: tuple[int, ...]
    data_start: int  # absolute byte offset in `file`
    data_end: int

    @property
    def nbytes(self) -> int:
        return self.data_end - self.data_start

    @property
    def numel(self) -> int:
        return element_count(self.shape)


@dataclass(frozen=True)
class MlaGeometry:
    """The multi-head latent attention sizes of an MLA draft (DeepSeek / Kimi style)."""

    q_lora_rank: int | None
    kv_lora_rank: int
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int


@dataclass(frozen=True)
class Geometry:
    """The draft's sizes as its model class builds them: widths, layers, heads, norms and rope."""

    hidden_size: int  # H
    target_hidden_size: int | None  # T (None: unknown until a target is given)
    intermediate_size: int  # I
    num_layers: int  # draft decoder layers, from the tensors
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    rope_scaling: dict[str, Any] | None
    max_position_embeddings: int | None
    attention_bias: bool = False
    sliding_window: int | None = None
    mla: MlaGeometry | None = None

    @property
    def target_hidden(self) -> int:
        """T as the draft computes with it: the target's width, or H when neither config nor target gives one."""
        return self.target_hidden_size or self.hidden_size


@dataclass(frozen=True)
class AuxLayers:
    """Aux hidden-state layer ids. `ids` is always in vLLM convention (HF hidden_states index = input of layer i)."""

    ids: tuple[int, ...] | None
    as_written: tuple[int, ...] | None
    convention: IdConvention | None  # None: unknown
    convention_known: bool  # False when the convention was inferred by heuristic
    location: IdLocation | None
    source: str  # human sentence: where the ids came from


@dataclass(frozen=True)
class VocabMap:
    """The target and draft vocabulary sizes, and which of the maps between them the draft stores."""

    vocab_size: int | None  # V
    draft_vocab_size: int  # Vd (rows of lm_head, or from config)
    has_d2t: bool
    has_t2d: bool
    order: VocabOrder | None = None  # None: not read yet (needs tensor values)


@dataclass(frozen=True)
class Flags:
    """EAGLE-3.1 and norm flags as the source meant them (None = not written in the config)."""

    fc_norm: bool
    norm_output: bool
    norm_before_fc: bool
    norm_before_residual: bool | None


@dataclass(frozen=True)
class SourceFacts:
    """What the checkpoint itself wrote, kept beside the derived values so rules can compare the two."""

    tensor_layer_ids: tuple[int, ...] = ()  # decoder layer indices that have tensors
    renamed_hidden_norm_layers: tuple[int, ...] = ()  # ModelOpt Megatron hidden_norm read as input_layernorm (P32)
    fc_in_features: int | None = None  # fc.weight fan-in, when fc.weight is a matrix
    fc_norm_tensor_ids: tuple[int, ...] = ()  # k of every fc_norm.{k}.weight
    config_hidden_size: int | None = None
    config_num_layers: int | None = None
    config_num_aux_hidden_states: int | None = None
    config_vocab_size: int | None = None
    config_draft_vocab_size: int | None = None
    target_hidden_size_written: bool = False
    rope_theta_written: bool = False
    norm_output_written: bool = False
    norm_before_residual_default: bool | None = None  # what the producer's consumer assumes when the key is absent
    trained_on_default_ids: bool = False  # the producer hard-wires the engine default ids (SafeAILab EAGLE, SGLang)
    norm_before_residual_forced: bool = False  # true written by a converter, not by training (ModelOpt, P12)
    norm_output_meaning_versioned: bool = False  # norm_output's meaning changed between producer releases (P35)
    vllm_layout: bool = False  # vLLM's own flat layout (what upgrade writes)
    parallel_drafting: bool = False  # P-EAGLE: trained to propose all k tokens in one forward (mask_hidden slots)
    mask_token_id: int | None = None  # the token id of those slots (speculators' mask_token_id, vLLM's pard_token)
    config_problems: tuple[ConfigProblem, ...] = ()  # written values of the wrong type or range (never defaulted)
    aux_ids_key: str = "eagle_aux_hidden_state_layer_ids"  # the top-level key the producer writes its aux ids under


def aux_count(fc_in_features: int | None, target_hidden: int) -> int | None:
    """K, the number of target states fc concatenates: its fan-in over T (None: unknown or not a whole multiple)."""
    if not fc_in_features or not target_hidden or fc_in_features % target_hidden:
        return None
    return fc_in_features // target_hidden


def eagle_version(fc_norm: bool, norm_output: bool) -> EagleVersion:
    """"3.1" with both EAGLE-3.1 functions, "3.1-partial" with one, else "3"."""
    if fc_norm and norm_output:
        return "3.1"
    return "3.1-partial" if fc_norm or norm_output else "3"


@dataclass
class DraftSpec:
    """A draft checkpoint, whatever its layout: what it is, how it is built and where each tensor lies."""

    path: str
    files: list[str]
    family: str
    producer: str
    attention: Attention
    architectures: list[str]
    model_type: str | None
    config_layout: ConfigLayout
    geometry: Geometry
    num_aux_hidden_states: int | None  # K from the tensors (fc fan-in / T) or config
    aux: AuxLayers
    vocab: VocabMap
    flags: Flags
    has_embed_tokens: bool
    has_lm_head: bool
    dtype: str
    tensors: dict[str, TensorRef]
    config: dict[str, Any]
    metadata: dict[str, str] = field(default_factory=dict)
    facts: SourceFacts = SourceFacts()
    target: TargetInfo | None = None  # the target it was resolved against (eaglekit.families.apply_target)
    written: DraftSpec | None = field(default=None, repr=False, compare=False)
    """The draft as its files record it, before the target filled in what they leave implicit (T, V, default
    aux ids); None when this spec is that."""

    @property
    def as_written(self) -> DraftSpec:
        return self.written or self

    @property
    def eagle_version(self) -> EagleVersion:
        return eagle_version(self.flags.fc_norm, self.flags.norm_output)

    @property
    def num_parameters(self) -> int:
        return sum(t.numel for t in self.tensors.values())

    @property
    def total_bytes(self) -> int:
        return sum(t.nbytes for t in self.tensors.values())

    def to_dict(self) -> dict[str, Any]:
        data = asdict(replace(self, written=None))
        del data["written"]
        data["tensors"] = {k: asdict(v) for k, v in self.tensors.items()}
        data["eagle_version"] = self.eagle_version
        return data
