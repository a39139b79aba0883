"""ModelOpt HF export (F6): eagle_config with ModelOpt extras, output-of-layer ids, frequency-ordered d2t."""

from eaglekit.families.base import MODELOPT_EAGLE_KEYS, Observed, Traits, family


@family("modelopt", priority=50,
        traits=Traits("ModelOpt HF export", "output", ("eagle_config", "top-level"), False))
class ModelOptHf:
    @staticmethod
    def matches(obs: Observed) -> bool:
        return any(k in obs.eagle_config for k in MODELOPT_EAGLE_KEYS)
