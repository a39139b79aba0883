"""SGLang repack of EAGLE (F2): LlamaForCausalLMEagle3 with an F1-style config (no rope_theta, no eagle_config)."""

from eaglekit.families.base import Observed, Traits

PRIORITY = 90


def matches(obs: Observed) -> bool:
    return obs.architecture == "LlamaForCausalLMEagle3" and "midlayer." in obs.forms


def traits(obs: Observed) -> Traits:
    return Traits("sglang", "SGLang repack of EAGLE", "output", ("eagle_config", "top-level"), False,
                  trained_on_default_ids=True)
