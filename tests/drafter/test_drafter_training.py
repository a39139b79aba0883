"""What a training script needs: gradients, training-time-test unrolling over earlier keys, canonical save/load."""

from __future__ import annotations

import os
import shutil

import pytest
import torch
from safetensors.torch import save_file

from eaglekit.drafter.config import DrafterConfig
from eaglekit.drafter.model import Drafter
from eaglekit.errors import UsageError
from eaglekit.families import load_draft
from tests.support.factory import Recipe, canonical_tensors, make_draft
from tests.support.plain_drafter import TINY, assert_close, plain_for, run_drafter, scenario

pytestmark = pytest.mark.model

DIRECT = ("fc.weight", "fc_norm.0.weight", "fc_norm.1.weight", "layers.0.hidden_norm.weight",
          "layers.0.input_layernorm.weight", "layers.0.self_attn.o_proj.weight", "layers.0.mlp.down_proj.weight",
          "layers.1.input_layernorm.weight", "norm.weight", "lm_head.weight", "embed_tokens.weight")
ROPE_ROUNDING = 2.0**-24  # relative rounding of the float32 RoPE table, the one float32 input of a float64 drafter


def _draft(tmp_path, **overrides):
    recipe = Recipe(**{**TINY, "fc_norm": True, "k": 2, "layers": 2, **overrides})
    return make_draft(str(tmp_path / "d"), "vllm", recipe), recipe


def test_gradients_match_the_plain_reference(tmp_path):
    """Loss over a prefill and two fed-back steps (cache in graph mode); gradients of fc, fc_norm, norms, heads.

    Both sides run in float64, so the comparison checks the gradient graph, not float32 rounding: the loss is a
    sum of signed terms that cancel to ~4e-4 of their absolute sum, so float32 arithmetic leaves a relative error
    of ~3e-5 that moves with the thread count. In float64 only the RoPE table stays float32 (vLLM computes it
    that way, and so does the drafter); it rounds each cos/sin by at most 2^-24 relative, which bounds the loss
    error by 2^-24 of the terms' absolute sum and each gradient's by 2^-24 of its largest entry (measured:
    5e-11 and 4e-9 of those scales). Float64 reductions in any order move results by ~1e-16.
    """
    path, recipe = _draft(tmp_path, norm_output=True)
    drafter = Drafter.from_spec(load_draft(path), dtype=torch.float64)
    scen = scenario(recipe.k, recipe.T, recipe.vocab, batch=1, decode=2)
    weights = {k: torch.tensor(v, dtype=torch.float64, requires_grad=True) for k, v in canonical_tensors(recipe).items()
               if v.dtype.kind == "f"}
    probe = torch.randn(recipe.Vd, generator=torch.Generator().manual_seed(3))

    cache = drafter.new_cache(1, 8)
    prompt = scen["prompt"]
    out = drafter(scen["ids"][:, :prompt], drafter.combine(scen["aux"]), torch.arange(prompt)[None], cache)
    loss = (out.draft_logits * probe).sum()
    for j in range(scen["decode"]):
        step_ids = scen["ids"][:, prompt + j:prompt + j + 1]
        out = drafter(step_ids, out.feedback[:, -1:], torch.tensor([[prompt + j]]), cache)
        loss = loss + (out.draft_logits * probe).sum()
    loss.backward()

    plain = plain_for(path, recipe, weights={**canonical_tensors(recipe), **weights})()
    rows = [plain.step(int(scen["ids"][0, i]), plain.combine(scen["aux"][0, i]), i) for i in range(prompt)]
    feedback = rows[-1]["feedback"]
    for j in range(scen["decode"]):
        rows.append(plain.step(int(scen["ids"][0, prompt + j]), feedback, prompt + j))
        feedback = rows[-1]["feedback"]
    terms = torch.cat([r["draft_logits"].reshape(-1) * probe.double() for r in rows])
    ref_loss = terms.sum()
    ref_loss.backward()

    magnitude = float(terms.detach().abs().sum())
    assert abs(float(loss.detach()) - float(ref_loss.detach())) <= ROPE_ROUNDING * magnitude
    params = dict(drafter.named_parameters())
    for name in DIRECT:
        assert_close(params[name].grad, weights[name].grad, f"grad {name}", rel=ROPE_ROUNDING)
    qkv = torch.cat([weights[f"layers.0.self_attn.{p}_proj.weight"].grad for p in "qkv"])
    assert_close(params["layers.0.self_attn.qkv_proj.weight"].grad, qkv, "grad q|k|v", rel=ROPE_ROUNDING)


def test_training_time_test_unroll_attends_over_earlier_steps(tmp_path):
    """Unroll step 2 re-uses step 1's positions; with attn_bias row i sees step-1 keys 0..i and its own key.

    That is exactly a single-token step at position i after a cache holding step-1 rows 0..i, which is
    how the expectation is computed here (with the default mask, independent of attn_bias).
    """
    path, recipe = _draft(tmp_path)
    drafter = Drafter.from_spec(load_draft(path))
    gen = torch.Generator().manual_seed(8)
    s = 5
    ids1, ids2 = torch.randint(0, recipe.vocab, (2, 1, s), generator=gen)
    aux = torch.randn(1, s, recipe.k * recipe.T, generator=gen)
    pos = torch.arange(s)[None]
    cache = drafter.new_cache(1, 2 * s)
    hidden = drafter.combine(aux)
    first = drafter(ids1, hidden, pos, cache)
    visible = torch.cat([torch.tril(torch.ones(s, s, dtype=torch.bool)), torch.eye(s, dtype=torch.bool)], dim=1)
    bias = torch.zeros(1, 1, s, 2 * s).masked_fill(~visible, float("-inf"))
    second = drafter(ids2, first.feedback, pos, cache, attn_bias=bias)
    (first.draft_logits.sum() + second.draft_logits.pow(2).sum()).backward()  # graph-mode cache survives backward
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in drafter.parameters())

    with torch.no_grad():
        hidden = drafter.combine(aux)
        for i in range(s):
            fresh = drafter.new_cache(1, s)
            drafter(ids1[:, : i + 1], hidden[:, : i + 1], pos[:, : i + 1], fresh)
            row = drafter(ids2[:, i:i + 1], first.feedback[:, i:i + 1], pos[:, i:i + 1], fresh)
            assert_close(second.feedback[:, i:i + 1], row.feedback, f"row {i} feedback")
            assert_close(second.logits[:, i:i + 1], row.logits, f"row {i} logits")
    with pytest.raises(UsageError, match="attn_bias"):
        drafter(ids2, first.feedback, pos, drafter.new_cache(1, s), attn_bias=bias)


def test_state_dict_uses_canonical_names_and_saves_as_a_checkpoint(tmp_path):
    path, recipe = _draft(tmp_path, norm_output=True, draft_vocab=40)
    spec = load_draft(path)
    drafter = Drafter.from_spec(spec)
    state = drafter.state_dict()
    assert set(state) == set(spec.tensors) - {"t2d"}
    out = tmp_path / "saved"
    out.mkdir()
    save_file({k: v.contiguous() for k, v in state.items()}, str(out / "model.safetensors"), metadata={"format": "pt"})
    shutil.copy(os.path.join(path, "config.json"), out / "config.json")
    reloaded = Drafter.from_spec(load_draft(str(out)))
    scen = scenario(recipe.k, recipe.T, recipe.vocab, decode=2)
    for got, want in zip(run_drafter(reloaded, scen), run_drafter(drafter, scen)):
        assert torch.equal(got["logits"], want["logits"]) and torch.equal(got["feedback"], want["feedback"])

    again = Drafter.from_state_dict(drafter.config, {**state, "t2d": torch.ones(recipe.vocab, dtype=torch.bool)})
    fresh = Drafter(drafter.config)
    fresh.load_state_dict(state)
    for other in (again, fresh):
        for got, want in zip(run_drafter(other, scen), run_drafter(drafter, scen)):
            assert torch.equal(got["feedback"], want["feedback"])
    with pytest.raises(UsageError, match="layers.0.mlp.gate.weight"):
        Drafter.from_state_dict(drafter.config, {**state, "layers.0.mlp.gate.weight": torch.zeros(1)})


def test_fresh_drafter_for_training_from_scratch():
    """A drafter built from a hand-written config, borrowing the target's embedding, trains out of the box."""
    config = DrafterConfig(hidden_size=32, target_hidden_size=24, intermediate_size=48, num_layers=1, num_heads=4,
                           num_kv_heads=2, head_dim=8, num_aux_hidden_states=3, vocab_size=64, draft_vocab_size=16,
                           fc_norm=True, norm_output=True)
    embed = torch.randn(64, 32)
    torch.manual_seed(0)
    drafter = Drafter(config, embed_tokens=embed)
    assert "embed_tokens.weight" not in drafter.state_dict()
    assert {n for n, _ in drafter.named_parameters()} >= {"fc.weight", "lm_head.weight", "fc_norm.2.weight"}
    assert float(drafter.fc.weight.detach().std()) == pytest.approx(0.02, rel=0.1)
    assert torch.equal(drafter.norm.weight, torch.ones(32))
    out = drafter(torch.randint(0, 64, (2, 3)), drafter.combine(torch.randn(2, 3, 72)), torch.arange(3).expand(2, 3))
    assert out.logits.shape == (2, 3, 64) and int(torch.isfinite(out.logits[0, 0]).sum()) == 16
    out.logits.logsumexp(-1).mean().backward(retain_graph=True)  # through the scatter into V: -inf columns add 0
    via_target_vocab = drafter.fc.weight.grad.clone()
    drafter.zero_grad()
    out.draft_logits.logsumexp(-1).mean().backward()
    assert torch.allclose(via_target_vocab, drafter.fc.weight.grad, rtol=1e-5, atol=1e-9)
    assert drafter.target_embed_tokens.grad is None



@pytest.mark.parametrize("first_row", [0, 3])
@pytest.mark.parametrize("norm_output", [False, True])
def test_unrolled_steps_equal_one_chain_per_row(tmp_path, first_row, norm_output):
    """Step j of the unroll at row i == the j-th step of a chain drafted after committing rows 0..i through the
    KV cache, one token at a time (teacher-forced tokens)."""
    from eaglekit.drafter.unroll import unrolled_steps

    path, recipe = _draft(tmp_path, norm_output=norm_output)
    drafter = Drafter.from_spec(load_draft(path))
    gen = torch.Generator().manual_seed(11)
    s, depth = 7, 3
    ids = torch.randint(0, recipe.vocab, (1, s + depth - 1), generator=gen)
    aux = torch.randn(1, s, recipe.k * recipe.T, generator=gen)
    with torch.no_grad():
        hidden = drafter.combine(aux)
        steps = list(unrolled_steps(drafter, ids, hidden, depth, first_row=first_row))
        assert [o.draft_logits.shape[1] for o in steps] == [s] + [s - first_row] * (depth - 1)
        for i in range(first_row, s):
            cache = drafter.new_cache(1, s + depth)
            out = drafter(ids[:, : i + 1], hidden[:, : i + 1], torch.arange(i + 1)[None], cache)
            chain = [out.draft_logits[:, i:], out.feedback[:, i:]]
            for j in range(depth):
                if j:
                    out = drafter(ids[:, i + j : i + j + 1], chain[1], torch.tensor([[i + j]]), cache)
                    chain = [out.draft_logits, out.feedback]
                row = i if j == 0 else i - first_row
                assert_close(steps[j].draft_logits[:, row : row + 1], chain[0], f"row {i} step {j} logits")
                assert_close(steps[j].feedback[:, row : row + 1], chain[1], f"row {i} step {j} feedback")
