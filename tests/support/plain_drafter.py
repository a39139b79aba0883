"""A plain, token-by-token re-implementation of vLLM's EAGLE-3 draft step, and the harness that runs it beside
eaglekit's Drafter on one scenario.

`PlainDraft` is deliberately naive: float64, one token at a time, explicit per-head loops, its own
list of past keys, RoPE and RMSNorm written from their definitions. It shares no code with
`eaglekit.drafter`.
"""

from __future__ import annotations

import json
import math
import os

import numpy as np
import torch

from eaglekit.drafter.model import Drafter
from tests.support.factory import Recipe, canonical_tensors

REL = 1e-5
TINY = dict(hidden=32, target_hidden=24, intermediate=48, heads=4, kv_heads=2, head_dim=8, vocab=64,
            dtype="F32", embed=True)


# ---------------------------------------------------------------- the plain reference


def rms(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    return w * (x / torch.sqrt((x * x).mean() + eps))


def silu(x: torch.Tensor) -> torch.Tensor:
    return x / (1 + torch.exp(-x))


class PlainDraft:
    """One sequence of vLLM's Eagle3 draft model (llama_eagle3 / qwen3_eagle3), token by token, float64."""

    def __init__(self, weights: dict[str, np.ndarray], *, heads: int, kv_heads: int, head_dim: int, layers: int,
                 eps: float, theta: float, fc_norm: bool, norm_output: bool, norm_before_fc: bool,
                 norm_before_residual: bool, qwen3: bool = False, window: int | None = None,
                 embed: torch.Tensor | None = None, head: torch.Tensor | None = None, vocab: int | None = None,
                 freqs: list[float] | None = None, magnitude: float = 1.0):
        self.w = {k: v if isinstance(v, torch.Tensor) else torch.from_numpy(v).to(torch.float64)
                  if v.dtype.kind == "f" else torch.from_numpy(v) for k, v in weights.items()}
        if embed is not None:
            self.w["embed_tokens.weight"] = embed.to(torch.float64)
        if head is not None:
            self.w["lm_head.weight"] = head.to(torch.float64)
        self.heads, self.kv_heads, self.head_dim, self.layers = heads, kv_heads, head_dim, layers
        self.eps, self.theta, self.qwen3, self.window = eps, theta, qwen3, window
        self.freqs, self.magnitude = freqs, magnitude  # scaled RoPE: frequencies and cos/sin factor given outright
        self.fc_norm, self.norm_output = fc_norm, norm_output
        self.norm_before_fc, self.norm_before_residual = norm_before_fc, norm_before_residual
        self.vocab = vocab or self.w["embed_tokens.weight"].shape[0]
        self.past = [[] for _ in range(layers)]  # per layer: list of (position, key heads, value heads)

    def combine(self, aux: torch.Tensor) -> torch.Tensor:
        a = aux.to(torch.float64)
        if "fc.weight" not in self.w:  # eagle_config.use_aux_hidden_state false: the state goes in as is
            return a
        if self.norm_before_fc:
            a = rms(a, self.w["input_norm.weight"], self.eps)
        if self.fc_norm:
            chunks = a.chunk(len([n for n in self.w if n.startswith("fc_norm.")]))
            a = torch.cat([rms(c, self.w[f"fc_norm.{k}.weight"], self.eps) for k, c in enumerate(chunks)])
        return self.w["fc.weight"] @ a

    def rotate(self, x: torch.Tensor, pos: int) -> torch.Tensor:
        d = x.shape[-1]
        out = x.clone()
        for i in range(d // 2):
            angle = pos * (self.freqs[i] if self.freqs else self.theta ** (-2 * i / d))
            cos, sin = math.cos(angle) * self.magnitude, math.sin(angle) * self.magnitude
            a, b = x[i], x[i + d // 2]
            out[i] = a * cos - b * sin
            out[i + d // 2] = b * cos + a * sin
        return out

    def attention(self, layer: int, x: torch.Tensor, pos: int) -> tuple[torch.Tensor, float]:
        p = f"layers.{layer}.self_attn."
        hd = self.head_dim

        def proj(name):
            y = self.w[p + name + ".weight"] @ x
            return y + self.w[p + name + ".bias"] if p + name + ".bias" in self.w else y

        q, k, v = proj("q_proj"), proj("k_proj"), proj("v_proj")
        qs = [q[h * hd:(h + 1) * hd] for h in range(self.heads)]
        ks = [k[h * hd:(h + 1) * hd] for h in range(self.kv_heads)]
        vs = [v[h * hd:(h + 1) * hd] for h in range(self.kv_heads)]
        if self.qwen3:
            qs = [rms(t, self.w[p + "q_norm.weight"], self.eps) for t in qs]
            ks = [rms(t, self.w[p + "k_norm.weight"], self.eps) for t in ks]
        qs = [self.rotate(t, pos) for t in qs]
        ks = [self.rotate(t, pos) for t in ks]
        self.past[layer].append((pos, ks, vs))
        outs, sink = [], 0.0
        for h in range(self.heads):
            g = h // (self.heads // self.kv_heads)
            seen = [(kp, kk[g], vv[g]) for kp, kk, vv in self.past[layer]
                    if self.window is None or pos - kp < self.window]
            scores = torch.stack([qs[h] @ kk / math.sqrt(hd) for _, kk, _ in seen])
            probs = torch.softmax(scores, dim=0)
            if self.window is None or pos - self.past[layer][0][0] < self.window:
                sink += float(probs[0].detach()) / self.heads
            outs.append(sum(pr * vv for pr, (_, _, vv) in zip(probs, seen)))
        o = self.w[p + "o_proj.weight"] @ torch.cat(outs)
        if p + "o_proj.bias" in self.w:
            o = o + self.w[p + "o_proj.bias"]
        return o, sink

    def mlp(self, layer: int, x: torch.Tensor) -> torch.Tensor:
        p = f"layers.{layer}.mlp."
        gate, up = self.w[p + "gate_proj.weight"] @ x, self.w[p + "up_proj.weight"] @ x
        return self.w[p + "down_proj.weight"] @ (silu(gate) * up)

    def step(self, token: int, g: torch.Tensor, pos: int) -> dict:
        g = g.to(torch.float64)
        w, eps = self.w, self.eps
        sink = None
        out = residual = None
        for i in range(self.layers):
            p = f"layers.{i}."
            if i == 0:
                e = rms(w["embed_tokens.weight"][token], w[p + "input_layernorm.weight"], eps)
                hn = rms(g, w[p + "hidden_norm.weight"], eps)
                x = torch.cat([e, hn])
                residual = hn if self.norm_before_residual else g
            else:
                residual = out + residual
                x = rms(residual, w[p + "input_layernorm.weight"], eps)
            attn, layer_sink = self.attention(i, x, pos)
            sink = layer_sink if i == 0 else sink
            residual = attn + residual
            out = self.mlp(i, rms(residual, w[p + "post_attention_layernorm.weight"], eps))
        prenorm = out + residual
        y = rms(prenorm, w["norm.weight"], eps)
        draft = w["lm_head.weight"] @ y
        full = torch.full((self.vocab,), float("-inf"), dtype=torch.float64)
        if "d2t" in w and draft.shape[0] < self.vocab:
            full[torch.arange(draft.shape[0]) + w["d2t"]] = draft
        else:
            full = draft
        return {"logits": full, "draft_logits": draft, "feedback": y if self.norm_output else prenorm, "sink": sink}


# ---------------------------------------------------------------- running both on one scenario


def scenario(k: int, t: int, vocab: int, *, batch: int = 2, prompt: int = 5, decode: int = 3, seed: int = 0) -> dict:
    """Aux states for a prompt, then `decode` fed-back steps; rows start at different positions."""
    gen = torch.Generator().manual_seed(seed)
    return {
        "aux": torch.randn(batch, prompt, k * t, generator=gen),
        "ids": torch.randint(0, vocab, (batch, prompt + decode), generator=gen),
        "start": torch.tensor([0, 11][:batch]),
        "prompt": prompt,
        "decode": decode,
    }


def run_drafter(drafter: Drafter, scen: dict) -> list[dict]:
    """Prefill with combine(aux), then single-token steps fed back through the cache."""
    device = drafter.norm.weight.device
    scen = {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in scen.items()}
    batch, prompt = scen["aux"].shape[:2]
    cache = drafter.new_cache(batch, prompt + scen["decode"])
    pos = scen["start"][:, None] + torch.arange(prompt, device=device)[None]
    with torch.no_grad():
        out = drafter(scen["ids"][:, :prompt], drafter.combine(scen["aux"]), pos, cache, return_sink_attention=True)
        results = [out]
        for j in range(scen["decode"]):
            step_pos = scen["start"][:, None] + prompt + j
            out = drafter(scen["ids"][:, prompt + j:prompt + j + 1], out.feedback[:, -1:], step_pos, cache,
                          return_sink_attention=True)
            results.append(out)
    return [{"logits": o.logits, "draft_logits": o.draft_logits, "feedback": o.feedback, "sink": o.sink_attention}
            for o in results]


def run_plain(make_plain, scen: dict) -> list[dict]:
    batch, prompt = scen["aux"].shape[:2]
    per_row = []
    for b in range(batch):
        plain = make_plain()
        start = int(scen["start"][b])
        rows = [plain.step(int(scen["ids"][b, i]), plain.combine(scen["aux"][b, i]), start + i) for i in range(prompt)]
        steps = [rows]
        feedback = rows[-1]["feedback"]
        for j in range(scen["decode"]):
            row = plain.step(int(scen["ids"][b, prompt + j]), feedback, start + prompt + j)
            steps.append([row])
            feedback = row["feedback"]
        per_row.append(steps)
    def stacked(s: int, key: str) -> torch.Tensor:
        return torch.stack([torch.stack([torch.as_tensor(r[key]) for r in per_row[b][s]]) for b in range(batch)])

    return [{key: stacked(s, key) for key in ("logits", "draft_logits", "feedback", "sink")}
            for s in range(len(per_row[0]))]


def assert_close(actual: torch.Tensor, expected: torch.Tensor, what: str, rel: float = REL) -> None:
    actual, expected = actual.detach().to(torch.float64), expected.detach().to(torch.float64)
    assert actual.shape == expected.shape, f"{what}: shape {tuple(actual.shape)} != {tuple(expected.shape)}"
    finite = torch.isfinite(expected)
    assert torch.equal(torch.isfinite(actual), finite), f"{what}: -inf pattern differs"
    scale = expected[finite].abs().max().clamp_min(1e-30)
    err = (actual[finite] - expected[finite]).abs().max() / scale
    assert err <= rel, f"{what}: relative error {float(err):.2e} > {rel:.0e}"


def assert_runs_match(got: list[dict], want: list[dict], rel: float = REL) -> None:
    assert len(got) == len(want)
    for s, (g, w) in enumerate(zip(got, want)):
        for key in ("logits", "draft_logits", "feedback", "sink"):
            assert_close(g[key], w[key], f"step {s} {key}", rel)


def plain_for(path: str, recipe: Recipe, **changes) -> callable:
    """A factory of PlainDraft instances reading geometry and flags from the written config.json."""
    with open(os.path.join(path, "config.json")) as fh:
        cfg = json.load(fh)
    layer_cfg = cfg.get("transformer_layer_config", cfg)
    flags = {
        "fc_norm": recipe.fc_norm, "norm_output": recipe.norm_output, "norm_before_fc": recipe.norm_before_fc,
        "norm_before_residual": bool(cfg.get("norm_before_residual", False)),
    }
    flags.update({k: v for k, v in changes.items() if k in flags})
    weights = changes.get("weights") or canonical_tensors(recipe)
    if recipe.Vd == recipe.vocab:
        weights = {k: v for k, v in weights.items() if k not in ("d2t", "t2d")}
    return lambda: PlainDraft(
        weights, heads=recipe.heads, kv_heads=recipe.kv_heads, head_dim=recipe.head_dim, layers=recipe.layers,
        eps=layer_cfg["rms_norm_eps"], theta=layer_cfg.get("rope_theta", 10000.0), qwen3=recipe.attention == "qwen3",
        window=changes.get("window"), embed=changes.get("embed"), head=changes.get("head"), vocab=recipe.vocab,
        freqs=changes.get("freqs"), magnitude=changes.get("magnitude", 1.0), **flags)
