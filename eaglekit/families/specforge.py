"""SpecForge export (F3 sglang, F3b hf): midlayer. names with a SpecForge config (rope_theta, eagle_config).

Its ids are output-of-layer. d2t and t2d are always written, even when the vocabulary is not pruned.
"""

from eaglekit.families.base import Observed, Traits, family


@family("specforge", priority=80)
class SpecForge:
    @staticmethod
    def matches(obs: Observed) -> bool:
        if obs.architecture != "LlamaForCausalLMEagle3" or "midlayer." not in obs.forms:
            return False
        cfg = obs.config
        return "rope_theta" in cfg or "eagle_config" in cfg or "rope_parameters" in cfg

    @staticmethod
    def traits(obs: Observed) -> Traits:
        hf = obs.has_exact("embed_tokens.weight")
        producer = "SpecForge export --to hf" if hf else "SpecForge export --to sglang"
        return Traits(producer, "output", ("eagle_config", "top-level"), False,
                      norm_output_meaning_versioned=True)
