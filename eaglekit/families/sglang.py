"""SGLang repack of EAGLE (F2): LlamaForCausalLMEagle3 with an F1-style config (no rope_theta, no eagle_config)."""

from eaglekit.families.base import Observed, Traits, family


@family("sglang", priority=90,
        traits=Traits("SGLang repack of EAGLE", "output", ("eagle_config", "top-level"), False,
                      trained_on_default_ids=True))
class SglangRepack:
    @staticmethod
    def matches(obs: Observed) -> bool:
        return obs.architecture == "LlamaForCausalLMEagle3" and "midlayer." in obs.forms
