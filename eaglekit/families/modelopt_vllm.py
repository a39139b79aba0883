"""ModelOpt convert_to_vllm_ckpt.py output (F6c): speculators layout, ids dropped, norm_before_residual forced true."""

from eaglekit.families.base import Observed, Traits

PRIORITY = 10


def matches(obs: Observed) -> bool:
    return obs.speculators_layout and obs.config.get("speculators_version") == "0.1.0.dev14"


def traits(obs: Observed) -> Traits:
    return Traits("modelopt-vllm", "ModelOpt convert_to_vllm_ckpt", "input", ("top-level",), True,
                  norm_before_residual_forced=True)
