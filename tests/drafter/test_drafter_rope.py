"""RoPE tables against transformers' own initialisers, and scaled RoPE end to end through the drafter."""

from __future__ import annotations

import pytest
import torch
from transformers import DeepseekV3Config, LlamaConfig
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3Attention

from eaglekit.drafter.model import Drafter
from eaglekit.drafter.rope import Rope
from eaglekit.errors import CheckpointError
from eaglekit.families import load_draft
from tests.support.factory import Recipe, make_draft
from tests.support.plain_drafter import TINY, assert_runs_match, plain_for, run_drafter, run_plain, scenario

SCALINGS = {
    "linear": {"rope_type": "linear", "factor": 2.0},
    "llama3": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 16},
    "yarn": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16},
    "yarn-mscale": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16, "mscale": 0.707,
                    "mscale_all_dim": 1.0, "beta_fast": 16},
    "yarn-attention-factor": {"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16,
                              "attention_factor": 0.9, "truncate": False},
}


def hf_rope(scaling: dict, theta: float, head_dim: int = 8) -> tuple[torch.Tensor, float]:
    params = {("rope_type" if k == "type" else k): v for k, v in scaling.items()}
    cfg = LlamaConfig(hidden_size=32, num_attention_heads=4, head_dim=head_dim, max_position_embeddings=256,
                      rope_parameters={**params, "rope_theta": theta})
    inv_freq, factor = ROPE_INIT_FUNCTIONS[params["rope_type"]](cfg, "cpu")
    return inv_freq, float(factor)


@pytest.mark.parametrize("name", SCALINGS)
def test_rope_table_equals_transformers(name):
    rope = Rope(8, 10000.0, SCALINGS[name])
    inv_freq, factor = hf_rope(SCALINGS[name], 10000.0)
    assert torch.equal(rope.inv_freq, inv_freq.float())
    assert rope.magnitude == pytest.approx(factor, rel=1e-12)
    assert rope.softmax_scale == 1.0


@pytest.mark.parametrize("name", SCALINGS)
def test_scaled_rope_end_to_end(tmp_path, name):
    """The drafter with a scaled-RoPE config equals the plain reference fed transformers' frequencies."""
    recipe = Recipe(**TINY)
    path = make_draft(str(tmp_path / name), "vllm", recipe, config_patch={"rope_scaling": SCALINGS[name]})
    drafter = Drafter.from_spec(load_draft(path))
    inv_freq, factor = hf_rope(SCALINGS[name], 10000.0)
    scen = scenario(recipe.k, recipe.T, recipe.vocab, decode=2)
    scen["start"] = torch.tensor([5, 30])
    want = run_plain(plain_for(path, recipe, freqs=inv_freq.tolist(), magnitude=factor), scen)
    assert_runs_match(run_drafter(drafter, scen), want)


def test_mrope_with_text_positions_is_the_default_rotation():
    mrope = Rope(8, 10000.0, {"type": "mrope", "mrope_section": [2, 1, 1]})
    assert mrope.kind == "default" and torch.equal(mrope.inv_freq, Rope(8, 10000.0, None).inv_freq)


@pytest.mark.parametrize("scaling", [
    {"type": "yarn", "factor": 40.0, "beta_fast": 32, "beta_slow": 1, "mscale": 1.0, "mscale_all_dim": 1.0,
     "original_max_position_embeddings": 4096},
    {"type": "yarn", "factor": 64.0, "beta_fast": 1.0, "beta_slow": 1, "mscale": 0.707, "mscale_all_dim": 0.707,
     "original_max_position_embeddings": 4096},
    {"type": "yarn", "factor": 16.0, "mscale": 0.8, "mscale_all_dim": 1.0, "original_max_position_embeddings": 512},
])
def test_deepseek_yarn_equals_transformers_deepseek_v3(scaling):
    """Frequencies, cos/sin factor and the mscale_all_dim softmax correction, as in HF DeepSeek-V3."""
    rope = Rope(64, 50000.0, scaling, mla=True)
    cfg = DeepseekV3Config(hidden_size=256, num_attention_heads=4, q_lora_rank=64, kv_lora_rank=32,
                           qk_nope_head_dim=32, qk_rope_head_dim=64, v_head_dim=32, max_position_embeddings=262144,
                           rope_parameters={**{("rope_type" if k == "type" else k): v for k, v in scaling.items()},
                                            "rope_theta": 50000.0})
    inv_freq, factor = ROPE_INIT_FUNCTIONS["yarn"](cfg, "cpu")
    assert rope.kind == "deepseek_yarn"
    assert torch.allclose(rope.inv_freq, inv_freq.float(), rtol=1e-6, atol=0)
    assert rope.magnitude == pytest.approx(float(factor), rel=1e-12)
    assert (32 + 64) ** -0.5 * rope.softmax_scale == pytest.approx(DeepseekV3Attention(cfg, 0).scaling, rel=1e-12)


def test_unsupported_rope_scaling_names_the_kind():
    with pytest.raises(CheckpointError, match="longrope"):
        Rope(8, 10000.0, {"rope_type": "longrope", "short_factor": [1.0], "long_factor": [1.0]})
    with pytest.raises(CheckpointError, match="original_max_position_embeddings"):
        Rope(8, 10000.0, {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0})
