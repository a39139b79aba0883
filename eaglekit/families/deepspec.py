"""DeepSpec Eagle3 drafters (deepseek-ai/DeepSpec `deepspec/modeling/eagle3/`, read at afdfa7c).

`build_draft_config` deep-copies the target's config and adds `architectures: ["Qwen3Eagle3Model"]` (Gemma4:
`Gemma4Eagle3Model`), `target_layer_ids`, `num_target_layers`, `ttt_length`, `step_loss_decay` and
`draft_num_hidden_layers`; `validate_eagle3_target_layer_ids` asserts exactly five ascending ids, and
`extract_eagle3_context_feature` concatenates `hidden_states[id + 1]`: output-of-layer ids. The trainer saves the
model's own state dict (`save_pretrained`): `embed_tokens`, `fc` (5·H in), `layers.{i}.` with per-head
`q_norm`/`k_norm` and a `hidden_norm` in every layer, `norm`, and a full-vocabulary `lm_head` (no d2t). The residual
is taken before `hidden_norm` (vLLM's norm_before_residual false). No engine registers either architecture.
Tried before AngelSlim: the Gemma4 config carries `target_model_type`, AngelSlim's marker.
"""

from eaglekit.families.base import Observed, Traits, family

ARCHITECTURES = ("Qwen3Eagle3Model", "Gemma4Eagle3Model")
TRAINING_KEYS = ("target_layer_ids", "ttt_length", "step_loss_decay")  # the fields Qwen3Eagle3Model asserts


@family("deepspec", priority=45,
        traits=Traits("DeepSpec", "output", ("top-level",), False, aux_ids_key="target_layer_ids"))
class DeepSpec:
    @staticmethod
    def matches(obs: Observed) -> bool:
        if obs.speculators_layout or "layers.{i}." not in obs.forms:
            return False
        return obs.architecture in ARCHITECTURES or all(k in obs.config for k in TRAINING_KEYS)
