"""ModelOpt HF export (F6): eagle_config with ModelOpt extras, output-of-layer ids, frequency-ordered d2t.

Its export template writes `eagle_aux_hidden_state_layer_ids: []` when training used ModelOpt's default ids
([1, L//2-1, L-4] output-of-layer, vLLM's (2, L//2, L-3)); vLLM reads an empty list as not written."""

from eaglekit.families.base import MODELOPT_EAGLE_KEYS, Observed, Traits, family


@family("modelopt", priority=50,
        traits=Traits("ModelOpt HF export", "output", ("eagle_config", "top-level"), False,
                      empty_ids_mean_default=True))
class ModelOptHf:
    @staticmethod
    def matches(obs: Observed) -> bool:
        return any(k in obs.eagle_config for k in MODELOPT_EAGLE_KEYS)
