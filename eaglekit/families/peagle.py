"""P-EAGLE (parallel EAGLE): an EAGLE-3 draft trained to propose all k tokens in one forward.

The k-1 slots after the last verified token hold a mask token (`mask_token_id`) and a learnt hidden state
(`mask_hidden`, K·T values), so vLLM serves it with `parallel_drafting: true`, never as EAGLE-3's sequential loop.
Two layouts: speculators' (speculators_model_type "peagle", speculators 0.9.0 models/peagle/{config,core}.py:
mask_token_id top-level, tensor mask_hidden [1, 1, K·T]), and vLLM's flat one, an EAGLE-3 architecture with the
token as pard_token (or mask_token_id) and the mask_hidden tensor. Tried before the plain speculators family.
"""

from eaglekit.families.base import PARALLEL_TOKEN_KEYS, Observed, Traits, family
from eaglekit.families.vllm import ARCHITECTURES as FLAT_ARCHITECTURES

SPECULATORS_TYPE = "peagle"


@family("peagle", priority=15)
class PEagle:
    @staticmethod
    def matches(obs: Observed) -> bool:
        if obs.speculators_layout:
            return obs.config.get("speculators_model_type") == SPECULATORS_TYPE
        return ("layers.{i}." in obs.forms and obs.architecture in FLAT_ARCHITECTURES
                and obs.has_exact("mask_hidden") and any(key in obs.config for key in PARALLEL_TOKEN_KEYS))

    @staticmethod
    def traits(obs: Observed) -> Traits:
        if obs.speculators_layout:
            # vLLM's update_peagle takes norm_before_residual false when absent, as speculators trains P-EAGLE
            return Traits("speculators (P-EAGLE)", "input", ("top-level",), norm_before_residual_default=False,
                          parallel_drafting=True)
        return Traits("vLLM flat layout (P-EAGLE)", "input", ("top-level", "eagle_config"), False, vllm_layout=True,
                      parallel_drafting=True)
