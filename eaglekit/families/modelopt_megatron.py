"""ModelOpt Megatron export (F6b): midlayer.{i}., layers >= 1 keep their input norm as hidden_norm (P32)."""

from eaglekit.families.base import Observed, Traits, family


@family("modelopt-megatron", priority=40,
        traits=Traits("ModelOpt Megatron export", "output", ("eagle_config", "top-level"), False,
                      hidden_norm_is_input_norm=True, empty_ids_mean_default=True))
class ModelOptMegatron:
    @staticmethod
    def matches(obs: Observed) -> bool:
        if obs.architecture == "LlamaForCausalLMEagle3Deep":
            return True
        cfg = obs.config
        nulls = all(k in cfg and cfg[k] is None for k in ("bos_token_id", "eos_token_id", "pad_token_id"))
        return nulls and "midlayer.{i}." in obs.forms
