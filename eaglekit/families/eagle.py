"""SafeAILab EAGLE (F1): LlamaForCausalLM + midlayer. + draft_vocab_size; ids hard-wired to (2, L//2, L-3)."""

from eaglekit.families.base import Observed, Traits, family


@family("eagle", priority=70,
        traits=Traits("SafeAILab EAGLE", "input", ("top-level",), False, trained_on_default_ids=True))
class SafeAILabEagle:
    @staticmethod
    def matches(obs: Observed) -> bool:
        return obs.architecture == "LlamaForCausalLM" and "midlayer." in obs.forms
