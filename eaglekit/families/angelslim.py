"""AngelSlim (F8): target_model_type / modal_type keys, or Eagle3LlamaForCausalLM with midlayer. names."""

from eaglekit.families.base import Observed, Traits, family


@family("angelslim", priority=60,
        traits=Traits("AngelSlim", None, ("top-level", "eagle_config"), False))
class AngelSlim:
    @staticmethod
    def matches(obs: Observed) -> bool:
        cfg = obs.config
        if "target_model_type" in cfg or "modal_type" in cfg:
            return True
        return obs.architecture == "Eagle3LlamaForCausalLM" and "midlayer." in obs.forms
