"""The reference drafter against a plain, token-by-token re-implementation of vLLM's EAGLE-3 step.

`PlainDraft` (tests/support/plain_drafter.py) is deliberately naive: float64, one token at a time, explicit
per-head loops, its own list of past keys, RoPE and RMSNorm written from their definitions. It shares no code
with `eaglekit.drafter`. Every test writes a real checkpoint with the fixture factory and loads it
through `load_draft` -> `Drafter.from_spec`.
"""

from __future__ import annotations

import itertools
import os

import numpy as np
import pytest
import torch

from eaglekit.drafter.model import Drafter
from eaglekit.errors import CheckpointError, UsageError
from eaglekit.families import load_draft
from tests.support.factory import Recipe, canonical_tensors, encode, make_draft, write_safetensors
from tests.support.plain_drafter import (
    REL,
    TINY,
    assert_close,
    assert_runs_match,
    plain_for,
    run_drafter,
    run_plain,
    scenario,
)


def write(tmp_path, name: str, layout: str = "vllm", **overrides) -> tuple[str, Recipe]:
    recipe = Recipe(**{**TINY, **overrides})
    return make_draft(str(tmp_path / name), layout, recipe), recipe


# ---------------------------------------------------------------- the flag product


BOOL_FLAGS = ("fc_norm", "norm_output", "norm_before_fc", "norm_before_residual", "reduced_vocab")
OTHER_AXES = {"k": (2, 3, 4), "layers": (1, 2), "attention": ("llama", "qwen3")}


def _flag_cases() -> list[dict]:
    """Every combination of the five cheap boolean flags (32), each crossed with one (K, layers, attention)
    chosen greedily so that every value of those axes meets every value of every boolean flag."""
    combos = list(itertools.product(*OTHER_AXES.values()))
    covered: set = set()
    used: dict = {}
    cases = []
    for bits in itertools.product((False, True), repeat=len(BOOL_FLAGS)):
        flags = dict(zip(BOOL_FLAGS, bits))

        def pairs(combo, flags=flags):
            return {(f, v, axis, x) for f, v in flags.items() for axis, x in zip(OTHER_AXES, combo)}

        best = max(combos, key=lambda combo: (len(pairs(combo) - covered), -used.get(combo, 0)))
        covered |= pairs(best)
        used[best] = used.get(best, 0) + 1
        cases.append({**flags, **dict(zip(OTHER_AXES, best))})
    return cases


FLAG_CASES = _flag_cases()


def _case_id(case: dict) -> str:
    on = [f for f in BOOL_FLAGS if case[f]]
    return f"{case['attention']}-L{case['layers']}-K{case['k']}-" + ("+".join(on) or "plain")


def test_flag_cases_cover_every_pair():
    for flag in BOOL_FLAGS:
        for value in (False, True):
            for axis, values in OTHER_AXES.items():
                seen = {c[axis] for c in FLAG_CASES if c[flag] == value}
                assert seen == set(values), f"{axis} values {set(values) - seen} never meet {flag}={value}"
    assert len({tuple(c[f] for f in BOOL_FLAGS) for c in FLAG_CASES}) == 2 ** len(BOOL_FLAGS)


@pytest.mark.parametrize("case", FLAG_CASES, ids=_case_id)
def test_step_matches_plain_reference(tmp_path, case):
    path, recipe = write(
        tmp_path, "d", fc_norm=case["fc_norm"], norm_output=case["norm_output"], norm_before_fc=case["norm_before_fc"],
        norm_before_residual=case["norm_before_residual"], draft_vocab=40 if case["reduced_vocab"] else None,
        k=case["k"], layers=case["layers"], attention=case["attention"], seed=len(_case_id(case)))
    drafter = Drafter.from_spec(load_draft(path))
    assert drafter.config.num_aux_hidden_states == case["k"]
    assert drafter.config.norm_before_residual == case["norm_before_residual"]
    scen = scenario(case["k"], recipe.T, recipe.vocab)
    got = run_drafter(drafter, scen)
    assert_runs_match(got, run_plain(plain_for(path, recipe), scen))
    if case["reduced_vocab"]:
        assert int(torch.isfinite(got[0]["logits"][0, 0]).sum()) == 40


# ---------------------------------------------------------------- every published layout


LLAMA_LAYOUTS = ("eagle", "sglang", "specforge", "specforge-hf", "speculators", "speculators-train", "modelopt",
                 "modelopt-megatron", "modelopt-vllm", "torchspec", "torchspec-vllm", "angelslim", "vllm")


@pytest.mark.parametrize("layout", LLAMA_LAYOUTS)
def test_every_layout_loads_to_the_same_function(tmp_path, layout):
    layers = 2 if layout == "modelopt-megatron" else 1
    path, recipe = write(tmp_path, layout, layout, fc_norm=layout in ("torchspec", "vllm"), layers=layers,
                         norm_output=layout == "speculators-train")
    drafter = Drafter.from_spec(load_draft(path))
    scen = scenario(recipe.k, recipe.T, recipe.vocab, decode=2)
    assert_runs_match(run_drafter(drafter, scen), run_plain(plain_for(path, recipe), scen))


def test_speculators_layout_defaults_norm_before_residual_to_true(tmp_path):
    """vLLM's speculators path (update_eagle3) reads an absent norm_before_residual as true."""
    path, recipe = write(tmp_path, "s", "speculators", norm_before_residual=None)
    drafter = Drafter.from_spec(load_draft(path))
    assert drafter.config.norm_before_residual is True
    scen = scenario(recipe.k, recipe.T, recipe.vocab, decode=1)
    assert_runs_match(run_drafter(drafter, scen), run_plain(plain_for(path, recipe, norm_before_residual=True), scen))


# ---------------------------------------------------------------- target-shared embed / head, overrides


def test_target_embedding_and_head_are_used_when_the_draft_has_none(tmp_path):
    path, recipe = write(tmp_path, "shared", target_hidden=None, embed=False, lm_head=False, draft_vocab=None)
    spec = load_draft(path)
    gen = torch.Generator().manual_seed(5)
    embed, head = torch.randn(64, 32, generator=gen), torch.randn(64, 32, generator=gen) * 0.1
    with pytest.raises(UsageError, match="embed_tokens"):
        Drafter.from_spec(spec, lm_head=head)
    with pytest.raises(UsageError, match="lm_head"):
        Drafter.from_spec(spec, embed_tokens=embed)
    drafter = Drafter.from_spec(spec, embed_tokens=embed, lm_head=head)
    assert "embed_tokens.weight" not in drafter.state_dict() and "lm_head.weight" not in drafter.state_dict()
    scen = scenario(recipe.k, recipe.T, recipe.vocab, decode=2)
    assert_runs_match(run_drafter(drafter, scen), run_plain(plain_for(path, recipe, embed=embed, head=head), scen))


def test_reduced_vocab_draft_cannot_borrow_the_target_head(tmp_path):
    path, _ = write(tmp_path, "nohead", lm_head=False, draft_vocab=40)
    with pytest.raises(CheckpointError, match="lm_head"):
        Drafter.from_spec(load_draft(path), lm_head=torch.zeros(64, 32))


@pytest.mark.parametrize("override", [{"norm_output": True}, {"fc_norm": True}, {"norm_before_residual": True},
                                      {"norm_before_fc": True}])
def test_overrides_change_the_function_as_if_the_flag_were_set(tmp_path, override):
    """A flag turned on without tensors runs with unit weights, like vLLM with a missing norm tensor."""
    path, recipe = write(tmp_path, "o", k=2)
    drafter = Drafter.from_spec(load_draft(path), overrides=override)
    weights = canonical_tensors(recipe)
    if override.get("fc_norm"):
        weights.update({f"fc_norm.{k}.weight": np.ones(recipe.T, np.float32) for k in range(recipe.k)})
    if override.get("norm_before_fc"):
        weights["input_norm.weight"] = np.ones(recipe.k * recipe.T, np.float32)
    scen = scenario(recipe.k, recipe.T, recipe.vocab, decode=2)
    assert_runs_match(run_drafter(drafter, scen), run_plain(plain_for(path, recipe, weights=weights, **override), scen))
    baseline = run_drafter(Drafter.from_spec(load_draft(path)), scen)
    assert not torch.allclose(baseline[-1]["feedback"], run_drafter(drafter, scen)[-1]["feedback"])


def test_override_off_ignores_the_tensors(tmp_path):
    path, recipe = write(tmp_path, "off", fc_norm=True, norm_output=True)
    drafter = Drafter.from_spec(load_draft(path), overrides={"fc_norm": False, "norm_output": False})
    assert drafter.fc_norm is None
    scen = scenario(recipe.k, recipe.T, recipe.vocab, decode=2)
    plain = plain_for(path, recipe, fc_norm=False, norm_output=False)
    assert_runs_match(run_drafter(drafter, scen), run_plain(plain, scen))


def test_unknown_override_is_a_usage_error(tmp_path):
    path, _ = write(tmp_path, "u")
    with pytest.raises(UsageError, match="unknown drafter override"):
        Drafter.from_spec(load_draft(path), overrides={"norm_outptu": True})


def test_draft_without_fc_takes_the_target_state_as_is(tmp_path):
    """eagle_config.use_aux_hidden_state: false (EAGLE-1-style input): no fc, the last target state feeds layer 0."""
    recipe = Recipe(**{**TINY, "target_hidden": None, "k": 1})
    path = make_draft(str(tmp_path / "nofc"), "vllm", recipe, drop=("fc.weight",),
                      config_patch={"eagle_config": {"use_aux_hidden_state": False}})
    drafter = Drafter.from_spec(load_draft(path))
    assert drafter.fc is None
    weights = {k: v for k, v in canonical_tensors(recipe).items() if k != "fc.weight"}
    scen = scenario(1, recipe.hidden, recipe.vocab, decode=2)
    assert_runs_match(run_drafter(drafter, scen), run_plain(plain_for(path, recipe, weights=weights), scen))


# ---------------------------------------------------------------- attention variants


def test_attention_bias_is_applied(tmp_path):
    recipe_bias = {}
    gen = np.random.default_rng(3)
    for name, rows in (("q_proj", 4 * 8), ("k_proj", 2 * 8), ("v_proj", 2 * 8), ("o_proj", 32)):
        recipe_bias[f"layers.0.self_attn.{name}.bias"] = (gen.standard_normal(rows) * 0.1).astype(np.float32)
    recipe = Recipe(**TINY)
    path = make_draft(str(tmp_path / "b"), "vllm", recipe, add=recipe_bias, config_patch={"attention_bias": True})
    drafter = Drafter.from_spec(load_draft(path))
    weights = {**canonical_tensors(recipe), **recipe_bias}
    scen = scenario(recipe.k, recipe.T, recipe.vocab, decode=2)
    assert_runs_match(run_drafter(drafter, scen), run_plain(plain_for(path, recipe, weights=weights), scen))


@pytest.mark.parametrize("attention", ["llama", "qwen3"])
def test_sliding_window_limits_keys_by_position(tmp_path, attention):
    recipe = Recipe(**{**TINY, "attention": attention})
    path = make_draft(str(tmp_path / "w"), "vllm", recipe,
                      config_patch={"sliding_window": 3, "layer_types": ["sliding_attention"]})
    drafter = Drafter.from_spec(load_draft(path))
    assert drafter.config.sliding_windows == (3,)
    scen = scenario(recipe.k, recipe.T, recipe.vocab, prompt=6, decode=3)
    got = run_drafter(drafter, scen)
    assert_runs_match(got, run_plain(plain_for(path, recipe, window=3), scen))
    full = run_plain(plain_for(path, recipe), scen)
    assert not torch.allclose(got[-1]["feedback"].double(), full[-1]["feedback"], rtol=1e-4)


# ---------------------------------------------------------------- cache: incremental == full sequence


@pytest.mark.parametrize("attention,layers", [("llama", 1), ("qwen3", 2)])
def test_incremental_decoding_equals_full_sequence(tmp_path, attention, layers):
    path, recipe = write(tmp_path, "inc", attention=attention, layers=layers, fc_norm=True)
    drafter = Drafter.from_spec(load_draft(path))
    gen = torch.Generator().manual_seed(1)
    batch, total = 2, 9
    ids = torch.randint(0, recipe.vocab, (batch, total), generator=gen)
    hidden = torch.randn(batch, total, recipe.hidden, generator=gen)
    pos = torch.tensor([[0], [4]]) + torch.arange(total)
    with torch.no_grad():
        full = drafter(ids, hidden, pos, return_sink_attention=True)
        cache = drafter.new_cache(batch, 4)  # smaller than needed: the cache grows
        pieces = [drafter(ids[:, a:b], hidden[:, a:b], pos[:, a:b], cache, return_sink_attention=True)
                  for a, b in ((0, 4), (4, 5), (5, 8), (8, 9))]
    assert cache.length == total
    for key in ("logits", "draft_logits", "feedback", "sink_attention"):
        assert_close(torch.cat([getattr(p, key) for p in pieces], dim=1), getattr(full, key), key)


@pytest.mark.parametrize("norm_output", [False, True])
def test_last_row_only_is_the_full_pass_last_row_and_fills_the_same_cache(tmp_path, norm_output):
    path, recipe = write(tmp_path, "last", fc_norm=True, norm_output=norm_output, layers=2)
    drafter = Drafter.from_spec(load_draft(path))
    gen = torch.Generator().manual_seed(3)
    batch, total = 2, 7
    ids = torch.randint(0, recipe.vocab, (batch, total), generator=gen)
    hidden = torch.randn(batch, total, recipe.hidden, generator=gen)
    pos = torch.arange(total).repeat(batch, 1)
    with torch.no_grad():
        every_row, last_row = drafter.new_cache(batch, total), drafter.new_cache(batch, total)
        full = drafter(ids, hidden, pos, every_row)
        last = drafter(ids, hidden, pos, last_row, last_row_only=True)
        after = [drafter(ids[:, :1], hidden[:, :1], pos[:, -1:] + 1, cache) for cache in (every_row, last_row)]
    assert last.draft_logits.shape == (batch, 1, full.draft_logits.shape[-1])
    for key in ("draft_logits", "feedback"):
        assert_close(getattr(last, key), getattr(full, key)[:, -1:], key)
    assert_close(after[1].feedback, after[0].feedback, "the next step on either cache")


def _one_sequence(tmp_path, name: str, seed: int):
    """A written drafter and one random sequence of 8 rows for it: (drafter, recipe, generator, ids, hidden, pos)."""
    path, recipe = write(tmp_path, name)
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, recipe.vocab, (1, 8), generator=gen)
    hidden = torch.randn(1, 8, recipe.hidden, generator=gen)
    return Drafter.from_spec(load_draft(path)), recipe, gen, ids, hidden, torch.arange(8)[None]


def test_a_cache_copy_continues_alone(tmp_path):
    drafter, recipe, gen, ids, hidden, pos = _one_sequence(tmp_path, "copy", 4)
    with torch.no_grad():
        cache = drafter.new_cache(1, 8)
        drafter(ids[:, :5], hidden[:, :5], pos[:, :5], cache)
        twin = cache.copy()
        cache.truncate(2)  # the original rewrites rows the copy holds
        drafter(torch.full((1, 6), 7), torch.randn(1, 6, recipe.hidden, generator=gen), pos[:, 2:], cache)
        resumed = drafter(ids[:, 5:], hidden[:, 5:], pos[:, 5:], twin)
        fresh = drafter(ids, hidden, pos)
    assert (cache.length, twin.length) == (8, 8)
    assert_close(resumed.feedback, fresh.feedback[:, 5:], "feedback on the copy after the original moved on")


def test_truncate_rolls_back_rejected_rows(tmp_path):
    drafter, recipe, gen, ids, hidden, pos = _one_sequence(tmp_path, "t", 2)
    with torch.no_grad():
        cache = drafter.new_cache(1, 8)
        drafter(ids[:, :5], hidden[:, :5], pos[:, :5], cache)
        drafter(torch.full((1, 3), 7), torch.randn(1, 3, recipe.hidden, generator=gen), pos[:, 5:], cache)  # rejected
        cache.truncate(5)
        resumed = drafter(ids[:, 5:], hidden[:, 5:], pos[:, 5:], cache)
        fresh = drafter(ids, hidden, pos)
    assert_close(resumed.feedback, fresh.feedback[:, 5:], "feedback after truncate")
    with pytest.raises(UsageError):
        cache.truncate(9)
    with pytest.raises(UsageError, match="batch"):
        drafter(ids[:, :1].repeat(2, 1), hidden[:, :1].repeat(2, 1, 1), pos[:, :1].repeat(2, 1), cache)


def test_cache_survives_switching_between_inference_mode_and_no_grad(tmp_path):
    path, recipe = write(tmp_path, "im")
    drafter = Drafter.from_spec(load_draft(path))
    gen = torch.Generator().manual_seed(6)
    ids = torch.randint(0, recipe.vocab, (1, 6), generator=gen)
    hidden = torch.randn(1, 6, recipe.hidden, generator=gen)
    pos = torch.arange(6)[None]
    cache = drafter.new_cache(1, 6)
    with torch.inference_mode():
        drafter(ids[:, :4], hidden[:, :4], pos[:, :4], cache)
    with torch.no_grad():
        tail = drafter(ids[:, 4:], hidden[:, 4:], pos[:, 4:], cache)
        full = drafter(ids, hidden, pos)
    assert_close(tail.feedback, full.feedback[:, 4:], "feedback after switching modes")


# ---------------------------------------------------------------- the drift EAGLE-3.1 fixes


def _drift_weights(recipe: Recipe) -> dict[str, np.ndarray]:
    """Weights under which every layer pass adds a positive multiple of one fixed direction u.

    gate_proj == up_proj makes the MLP's inner product silu(z) * z = z^2 * sigmoid(z) >= 0 for every
    unit, and down_proj = u 1^T sums those non-negative values onto u; o_proj = 0 removes attention.
    So each step adds m * u with m > 0 to the residual stream. Fed back pre-norm (EAGLE-3), g_k
    accumulates k such increments and its RMS grows without bound; fed back post-norm (EAGLE-3.1),
    g_k = norm(p_k) has RMS fixed by the norm weight whatever p_k is.
    """
    w = canonical_tensors(recipe)
    rng = np.random.default_rng(11)
    u = rng.standard_normal(recipe.hidden).astype(np.float32)
    u /= np.linalg.norm(u)
    w["layers.0.mlp.up_proj.weight"] = w["layers.0.mlp.gate_proj.weight"].copy()
    w["layers.0.mlp.down_proj.weight"] = (np.outer(u, np.ones(recipe.intermediate)) * 2.0).astype(np.float32)
    w["layers.0.self_attn.o_proj.weight"] = np.zeros_like(w["layers.0.self_attn.o_proj.weight"])
    return w


@pytest.mark.parametrize("norm_output", [False, True])
def test_fed_back_state_drifts_without_norm_output_and_stays_bounded_with_it(tmp_path, norm_output):
    recipe = Recipe(**{**TINY, "norm_output": norm_output})
    weights = _drift_weights(recipe)
    path = make_draft(str(tmp_path / "drift"), "vllm", recipe, add={k: v for k, v in weights.items()
                                                                        if k.startswith("layers.0.")})
    drafter = Drafter.from_spec(load_draft(path))
    gen = torch.Generator().manual_seed(4)
    cache = drafter.new_cache(1, 16)
    with torch.no_grad():
        out = drafter(torch.tensor([[3, 9, 1]]), drafter.combine(torch.randn(1, 3, recipe.k * recipe.T, generator=gen)),
                      torch.arange(3)[None], cache)
        rms_by_depth = []
        for depth in range(8):
            out = drafter(torch.tensor([[5 + depth]]), out.feedback[:, -1:], torch.tensor([[3 + depth]]), cache)
            rms_by_depth.append(float(out.feedback.pow(2).mean().sqrt()))
    if norm_output:
        bound = float(drafter.norm.weight.detach().abs().max())
        assert max(rms_by_depth) <= bound * (1 + 1e-5), rms_by_depth
    else:
        assert all(b > a for a, b in zip(rms_by_depth, rms_by_depth[1:])), rms_by_depth
        assert rms_by_depth[-1] > 3 * rms_by_depth[0], rms_by_depth


# ---------------------------------------------------------------- bad inputs


def test_missing_tensor_names_the_tensor(tmp_path):
    recipe = Recipe(**TINY)
    path = make_draft(str(tmp_path / "m"), "vllm", recipe, drop=("layers.0.mlp.down_proj.weight",))
    with pytest.raises(CheckpointError, match="layers.0.mlp.down_proj.weight") as err:
        Drafter.from_spec(load_draft(path))
    assert path in str(err.value)


def test_quantised_draft_is_refused(tmp_path):
    """FP8 weights need their scales applied; the reference drafter says so instead of computing garbage."""
    recipe = Recipe(**TINY)
    path = make_draft(str(tmp_path / "q"), "vllm", recipe)
    tensors = {n: ("I64" if a.dtype == np.int64 else "BOOL" if a.dtype == bool else "F32", a.shape,
                   encode(a, "I64" if a.dtype == np.int64 else "BOOL" if a.dtype == bool else "F32"))
               for n, a in canonical_tensors(recipe).items()}
    tensors["layers.0.mlp.down_proj.weight"] = ("F8_E4M3", (32, 48), bytes(32 * 48))
    write_safetensors(os.path.join(path, "model.safetensors"), tensors, {"format": "pt"})
    with pytest.raises(CheckpointError, match="F8_E4M3"):
        Drafter.from_spec(load_draft(path))


def test_combine_rejects_the_wrong_width(tmp_path):
    path, recipe = write(tmp_path, "c")
    drafter = Drafter.from_spec(load_draft(path))
    with pytest.raises(UsageError, match="K\\*T"):
        drafter.combine(torch.zeros(1, 1, recipe.k * recipe.T + 1))
    with pytest.raises(UsageError, match="aux states"):
        drafter.combine([torch.zeros(1, 1, recipe.T)] * (recipe.k - 1))


def test_bf16_drafter_tracks_fp32(tmp_path):
    path, recipe = write(tmp_path, "bf", fc_norm=True, norm_output=True)
    spec = load_draft(path)
    scen = scenario(recipe.k, recipe.T, recipe.vocab, decode=2)
    got = run_drafter(Drafter.from_spec(spec, dtype=torch.bfloat16), scen)
    want = run_drafter(Drafter.from_spec(spec), scen)
    assert got[0]["feedback"].dtype == torch.bfloat16
    for g, w in zip(got, want):
        assert_close(g["draft_logits"], w["draft_logits"], "bf16 draft logits", rel=5e-2)


@pytest.mark.triton
@pytest.mark.parametrize("attention", ["llama", "qwen3", "mla"])
def test_triton_kernel_path_matches_torch_path(tmp_path, monkeypatch, attention):
    """The fused Triton kernels (interpreted on CPU here) slot into the step with the torch path's numerics."""
    pytest.importorskip("triton")
    if attention == "mla":
        overrides = dict(attention="mla", target_hidden=None, draft_vocab=None, q_lora_rank=16, kv_lora_rank=12,
                         qk_nope_head_dim=8, qk_rope_head_dim=6, v_head_dim=10, fc_norm=True)
        path, recipe = write(tmp_path, "tr", "kimi", **overrides)
    else:
        path, recipe = write(tmp_path, "tr", attention=attention, fc_norm=True, norm_before_fc=attention == "qwen3",
                             layers=2, norm_output=True)
    scen = scenario(recipe.k, recipe.T, recipe.vocab, decode=2)
    for dtype, rel in ((torch.float32, REL), (torch.bfloat16, 2e-2)):
        drafter = Drafter.from_spec(load_draft(path), dtype=dtype)
        monkeypatch.setenv("EAGLEKIT_KERNELS", "torch")
        want = run_drafter(drafter, scen)
        monkeypatch.setenv("EAGLEKIT_KERNELS", "triton")
        assert_runs_match(run_drafter(drafter, scen), want, rel)


@pytest.mark.parametrize("attention", ["llama", "qwen3", "mla"])
def test_extend_cache_writes_the_bits_forward_writes_and_the_next_step_sees_no_difference(tmp_path, attention):
    """A prompt's earlier pieces run through `extend_cache` (no attention output, MLP or head for the last layer)
    leave the cache bit for bit as `forward` leaves it, so the last piece and every draft step after it compute
    exactly what they computed before; with two layers the first still runs whole."""
    if attention == "mla":
        path, recipe = write(tmp_path, "ec", "kimi", attention="mla", target_hidden=None, draft_vocab=None,
                             q_lora_rank=16, kv_lora_rank=12, qk_nope_head_dim=8, qk_rope_head_dim=6, v_head_dim=10)
    else:
        path, recipe = write(tmp_path, "ec", attention=attention, layers=2 if attention == "qwen3" else 1,
                             fc_norm=True, norm_output=True)
    drafter = Drafter.from_spec(load_draft(path))
    generator = torch.Generator().manual_seed(0)
    rows, pieces = 40, ((0, 16), (16, 32), (32, 40))
    ids = torch.randint(0, recipe.vocab, (1, rows), generator=generator)
    hidden = torch.randn(1, rows, drafter.config.hidden_size, generator=generator)
    positions = torch.arange(rows).unsqueeze(0)
    caches = [drafter.new_cache(1, rows + 4) for _ in range(2)]
    with torch.inference_mode():
        for skip, cache in zip((False, True), caches):
            for first, last in pieces[:-1]:
                part = (ids[:, first:last], hidden[:, first:last], positions[:, first:last], cache)
                drafter.extend_cache(*part) if skip else drafter(*part, last_row_only=True)
        first, last = pieces[-1]
        outs = [drafter(ids[:, first:last], hidden[:, first:last], positions[:, first:last], cache,
                        last_row_only=True) for cache in caches]
        steps = [drafter(ids[:, -1:], out.feedback, torch.tensor([[rows]]), cache)
                 for out, cache in zip(outs, caches)]
    assert caches[0].length == caches[1].length == rows + 1  # the prompt and one step
    assert caches[0]._tensors.keys() == caches[1]._tensors.keys() and caches[0]._tensors
    for key, held in caches[0]._tensors.items():
        assert torch.equal(held[:, :rows + 1], caches[1]._tensors[key][:, :rows + 1]), key
    for a, b in ((outs[0], outs[1]), (steps[0], steps[1])):
        assert torch.equal(a.draft_logits, b.draft_logits) and torch.equal(a.feedback, b.feedback)
    with pytest.raises(UsageError, match=r"a draft step takes input_ids \[B, S\]"):  # one line, like forward
        drafter.extend_cache(ids[0], hidden, positions, caches[0])
