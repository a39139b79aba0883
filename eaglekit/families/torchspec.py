"""TorchSpec convert_to_hf.py (F7): output-of-layer ids; `--vllm` exports shift kimi_k2 ids to input-of-layer."""

from eaglekit.families.base import Observed, Traits, family


@family("torchspec", priority=30)
class TorchSpec:
    @staticmethod
    def matches(obs: Observed) -> bool:
        return obs.torchspec_marker

    @staticmethod
    def traits(obs: Observed) -> Traits:
        vllm_export = "layers.{i}." in obs.forms and "midlayer." not in obs.forms
        shifted = vllm_export and obs.config.get("model_type") == "kimi_k2"
        producer = "TorchSpec convert_to_hf --vllm" if vllm_export else "TorchSpec convert_to_hf"
        return Traits(producer, "input" if shifted else "output", ("eagle_config", "top-level"), False)
