"""SpecForge export (F3 sglang, F3b hf): midlayer. names, d2t and t2d always, output-of-layer eagle_config ids."""

from eaglekit.families.base import Observed, Traits

PRIORITY = 80


def matches(obs: Observed) -> bool:
    if obs.architecture != "LlamaForCausalLMEagle3" or "midlayer." not in obs.forms:
        return False
    cfg = obs.config
    return "rope_theta" in cfg or "eagle_config" in cfg or "rope_parameters" in cfg or (obs.has_exact("d2t") and obs.has_exact("t2d"))


def traits(obs: Observed) -> Traits:
    hf = obs.has_exact("embed_tokens.weight")
    producer = "SpecForge export --to hf (F3b)" if hf else "SpecForge export --to sglang (F3)"
    return Traits("specforge", producer, "output", ("eagle_config", "top-level"), False)
