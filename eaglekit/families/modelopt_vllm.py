"""ModelOpt convert_to_vllm_ckpt.py output (F6c): speculators layout, ids dropped, norm_before_residual forced true."""

from eaglekit.families.base import Observed, Traits, family


@family("modelopt-vllm", priority=10,
        traits=Traits("ModelOpt convert_to_vllm_ckpt", "input", ("top-level",), True, norm_before_residual_forced=True))
class ModelOptVllm:
    @staticmethod
    def matches(obs: Observed) -> bool:
        return obs.speculators_layout and obs.config.get("speculators_version") == "0.1.0.dev14"
