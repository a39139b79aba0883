"""MLA (DeepSeek / Kimi) drafts against a plain re-implementation of vLLM's DeepseekV2MLAAttention.

`PlainMla` expands every cached latent into per-head keys and values, rotates interleaved pairs
(GPT-J style, as vLLM's deepseek rope does) with the DeepSeek-YaRN frequencies and magnitude
written out per dimension, and scales the softmax by mscale(mscale_all_dim)^2.
"""

from __future__ import annotations

import json
import math
import os

import pytest
import torch

from eaglekit.drafter.model import Drafter
from eaglekit.families import load_draft
from tests.support.factory import Recipe, canonical_tensors, make_draft
from tests.support.plain_drafter import (
    PlainDraft,
    assert_close,
    assert_runs_match,
    rms,
    run_drafter,
    run_plain,
    scenario,
)

MLA = dict(hidden=32, target_hidden=None, intermediate=48, heads=4, vocab=64, draft_vocab=None, dtype="F32",
           embed=True, attention="mla", q_lora_rank=16, kv_lora_rank=12, qk_nope_head_dim=8, qk_rope_head_dim=6,
           v_head_dim=10)


def deepseek_yarn(rot: int, theta: float, scaling: dict | None) -> tuple[list[float], float, float]:
    """(inverse frequencies, cos/sin magnitude, softmax-scale multiplier), one dimension at a time."""
    base = [theta ** (-2 * i / rot) for i in range(rot // 2)]
    if not scaling:
        return base, 1.0, 1.0
    factor = scaling["factor"]
    original = scaling["original_max_position_embeddings"]

    def mscale(m):
        return 1.0 if factor <= 1 else 0.1 * m * math.log(factor) + 1.0

    def dim_for(rotations):
        return rot * math.log(original / (rotations * 2 * math.pi)) / (2 * math.log(theta))

    low = max(math.floor(dim_for(scaling.get("beta_fast", 32))), 0)
    high = min(math.ceil(dim_for(scaling.get("beta_slow", 1))), rot - 1)
    freqs = []
    for i, f in enumerate(base):
        ramp = min(max((i - low) / ((high - low) or 0.001), 0.0), 1.0)
        extrapolate = 1 - ramp
        freqs.append(f / factor * (1 - extrapolate) + f * extrapolate)
    magnitude = mscale(scaling.get("mscale", 1)) / mscale(scaling.get("mscale_all_dim", 0))
    return freqs, magnitude, mscale(scaling.get("mscale_all_dim", 0)) ** 2


class PlainMla(PlainDraft):
    def __init__(self, weights, *, mla: dict, theta: float, scaling: dict | None, **kwargs):
        freqs, magnitude, self.softmax_mult = deepseek_yarn(mla["qk_rope_head_dim"], theta, scaling)
        super().__init__(weights, theta=theta, head_dim=0, kv_heads=kwargs["heads"], freqs=freqs, magnitude=magnitude,
                         **kwargs)
        self.m = mla

    def rotate(self, x, pos):
        out = x.clone()
        for i, f in enumerate(self.freqs):
            c, s = math.cos(pos * f) * self.magnitude, math.sin(pos * f) * self.magnitude
            out[2 * i] = x[2 * i] * c - x[2 * i + 1] * s
            out[2 * i + 1] = x[2 * i + 1] * c + x[2 * i] * s
        return out

    def attention(self, layer, x, pos):
        p, w, m = f"layers.{layer}.self_attn.", self.w, self.m
        dn, dr, dv = m["qk_nope_head_dim"], m["qk_rope_head_dim"], m["v_head_dim"]
        if m["q_lora_rank"]:
            q = w[p + "q_b_proj.weight"] @ rms(w[p + "q_a_proj.weight"] @ x, w[p + "q_a_layernorm.weight"], self.eps)
        else:
            q = w[p + "q_proj.weight"] @ x
        kv_a = w[p + "kv_a_proj_with_mqa.weight"] @ x
        latent = rms(kv_a[: m["kv_lora_rank"]], w[p + "kv_a_layernorm.weight"], self.eps)
        self.past[layer].append((pos, latent, self.rotate(kv_a[m["kv_lora_rank"]:], pos)))
        scale = (dn + dr) ** -0.5 * self.softmax_mult
        outs, sink = [], 0.0
        for h in range(self.heads):
            qh = q[h * (dn + dr):(h + 1) * (dn + dr)]
            q_full = torch.cat([qh[:dn], self.rotate(qh[dn:], pos)])
            keys, values = [], []
            for _, c, k_pe in self.past[layer]:
                kv = (w[p + "kv_b_proj.weight"] @ c)[h * (dn + dv):(h + 1) * (dn + dv)]
                keys.append(torch.cat([kv[:dn], k_pe]))
                values.append(kv[dn:])
            probs = torch.softmax(torch.stack([q_full @ k * scale for k in keys]), dim=0)
            sink += float(probs[0].detach()) / self.heads
            outs.append(sum(pr * v for pr, v in zip(probs, values)))
        return w[p + "o_proj.weight"] @ torch.cat(outs), sink


def plain_mla(path: str, recipe: Recipe, **flags):
    with open(os.path.join(path, "config.json")) as fh:
        cfg = json.load(fh)
    mla = {k: cfg[k] for k in ("q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim")}
    flags = {"fc_norm": recipe.fc_norm, "norm_output": recipe.norm_output, "norm_before_fc": False,
             "norm_before_residual": False, **flags}
    weights = {k: v for k, v in canonical_tensors(recipe).items() if k != "t2d"}
    return lambda: PlainMla(weights, mla=mla, theta=cfg["rope_theta"], scaling=cfg.get("rope_scaling"),
                            heads=recipe.heads, layers=recipe.layers, eps=cfg["rms_norm_eps"], vocab=recipe.vocab,
                            **flags)


def write_mla(tmp_path, name: str, config_patch: dict | None = None, **overrides) -> tuple[str, Recipe]:
    recipe = Recipe(**{**MLA, **overrides})
    return make_draft(str(tmp_path / name), "kimi", recipe, config_patch=config_patch), recipe


MLA_CASES = [
    dict(fc_norm=False, norm_output=False),
    dict(fc_norm=True, norm_output=False),
    dict(fc_norm=False, norm_output=True),
    dict(fc_norm=True, norm_output=True),
    dict(fc_norm=True, norm_output=True, q_lora_rank=None),
    dict(fc_norm=False, norm_output=True, layers=2, draft_vocab=40),
    dict(fc_norm=True, norm_output=False, k=4, rope="mscale-0.707"),
    dict(fc_norm=False, norm_output=False, rope="none"),
]


def _mla_id(case: dict) -> str:
    return "-".join(f"{k}={v}" for k, v in case.items())


ROPE_PATCHES = {
    "mscale-0.707": {"rope_scaling": {"type": "yarn", "factor": 8.0, "beta_fast": 32, "beta_slow": 1, "mscale": 0.707,
                                      "mscale_all_dim": 1.0, "original_max_position_embeddings": 64}},
    "none": {"rope_scaling": None},
}


@pytest.mark.parametrize("case", MLA_CASES, ids=_mla_id)
def test_mla_step_matches_plain_reference(tmp_path, case):
    case = dict(case)
    patch = ROPE_PATCHES.get(case.pop("rope", ""), None)
    path, recipe = write_mla(tmp_path, "mla", config_patch=patch, **case)
    spec = load_draft(path)
    assert spec.attention == "mla"
    drafter = Drafter.from_spec(spec)
    scen = scenario(recipe.k, recipe.T, recipe.vocab, decode=3)
    scen["start"] = torch.tensor([3, 40])  # past the original context, so YaRN interpolation matters
    assert_runs_match(run_drafter(drafter, scen), run_plain(plain_mla(path, recipe), scen))


def test_mla_yarn_scales_the_softmax(tmp_path):
    """DeepSeek YaRN multiplies the softmax scale by mscale(mscale_all_dim)^2; dropping it changes the step."""
    path, recipe = write_mla(tmp_path, "y")
    drafter = Drafter.from_spec(load_draft(path))
    attention = drafter.layers[0].self_attn
    assert attention.scale == pytest.approx((8 + 6) ** -0.5 * (0.1 * math.log(4.0) + 1.0) ** 2)
    scen = scenario(recipe.k, recipe.T, recipe.vocab, decode=1)
    want = run_drafter(drafter, scen)
    attention.scale = (8 + 6) ** -0.5
    assert not torch.allclose(run_drafter(drafter, scen)[-1]["feedback"], want[-1]["feedback"])


def test_mla_incremental_decoding_equals_full_sequence(tmp_path):
    path, recipe = write_mla(tmp_path, "inc", fc_norm=True, norm_output=True)
    drafter = Drafter.from_spec(load_draft(path))
    gen = torch.Generator().manual_seed(7)
    ids = torch.randint(0, recipe.vocab, (2, 7), generator=gen)
    hidden = torch.randn(2, 7, recipe.hidden, generator=gen)
    pos = torch.tensor([[0], [30]]) + torch.arange(7)
    with torch.no_grad():
        full = drafter(ids, hidden, pos, return_sink_attention=True)
        cache = drafter.new_cache(2, 7)
        pieces = [drafter(ids[:, a:b], hidden[:, a:b], pos[:, a:b], cache, return_sink_attention=True)
                  for a, b in ((0, 3), (3, 4), (4, 7))]
    for key in ("logits", "feedback", "sink_attention"):
        assert_close(torch.cat([getattr(p, key) for p in pieces], dim=1), getattr(full, key), key)
