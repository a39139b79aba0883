"""speculators layout (F4 convert, F5 train): speculators_config + transformer_layer_config, input-of-layer ids."""

from eaglekit.families.base import Observed, Traits, family


@family("speculators", priority=20)
class Speculators:
    @staticmethod
    def matches(obs: Observed) -> bool:
        return obs.speculators_layout and obs.config.get("speculators_version") != "0.1.0.dev14"

    @staticmethod
    def traits(obs: Observed) -> Traits:
        trained = obs.architecture == "Eagle3DraftModel"
        return Traits(
            producer="speculators train" if trained else "speculators convert",
            aux_convention="input",
            aux_keys=("top-level",),
            norm_before_residual_default=True,  # vLLM's speculators path (update_eagle3)
        )
