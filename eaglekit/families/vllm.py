"""vLLM-ready flat layout (what eaglekit upgrade writes): layers.{i}. names, top-level ids in vLLM convention."""

from eaglekit.families.base import Observed, Traits, family

ARCHITECTURES = (
    "LlamaForCausalLMEagle3", "Eagle3LlamaForCausalLM", "Eagle3Qwen3ForCausalLM",
    "Eagle3DeepseekV2ForCausalLM", "Eagle3DeepseekV3ForCausalLM", "LlamaForCausalLM",
)


@family("vllm", priority=92,
        traits=Traits("vLLM flat layout", "input", ("top-level", "eagle_config"), False, vllm_layout=True))
class VllmFlat:
    @staticmethod
    def matches(obs: Observed) -> bool:
        if obs.speculators_layout or "layers.{i}." not in obs.forms or obs.architecture not in ARCHITECTURES:
            return False
        # an MLA draft counts as vLLM layout only once its ids are written top-level
        return not obs.is_mla or "eagle_aux_hidden_state_layer_ids" in obs.config
