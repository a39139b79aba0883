"""CPU timing of the reference drafter's torch path against a straightforward Hugging Face-style drafter.

Shape of a SmolLM2-135M EAGLE-3.1 draft: H = T = 576, 9 query / 3 KV heads of 64, I = 1536, K = 3,
Vd = 8192 of V = 49152, one layer, fc_norm + norm_output, fp32. The baseline is written the way HF
Llama code is: separate q/k/v and gate/up Linears, an RMSNorm module, RoPE tables from position ids
per call, repeat_kv, SDPA, and a growing past-key-values concatenation. Both run the same weights;
their outputs are checked to agree before timing. Times are medians of wall-clock runs, the two
implementations timed alternately.

    python bench/cpu_drafter.py [--repeats 30] [--threads N]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch import nn  # noqa: E402

from eaglekit.drafter.config import DrafterConfig  # noqa: E402
from eaglekit.drafter.model import Drafter  # noqa: E402

CONFIG = DrafterConfig(hidden_size=576, target_hidden_size=576, intermediate_size=1536, num_layers=1, num_heads=9,
                       num_kv_heads=3, head_dim=64, num_aux_hidden_states=3, vocab_size=49152, draft_vocab_size=8192,
                       rms_norm_eps=1e-5, rope_theta=100000.0, fc_norm=True, norm_output=True)


class RMSNorm(nn.Module):
    def __init__(self, weight: torch.Tensor, eps: float):
        super().__init__()
        self.weight, self.eps = nn.Parameter(weight.clone()), eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        variance = x.float().pow(2).mean(-1, keepdim=True)
        return self.weight * (x.float() * torch.rsqrt(variance + self.eps)).to(x.dtype)


def _linear(weight: torch.Tensor) -> nn.Linear:
    layer = nn.Linear(weight.shape[1], weight.shape[0], bias=False)
    layer.weight = nn.Parameter(weight.clone())
    return layer


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2:]
    return torch.cat((-x2, x1), dim=-1)


class HfStyleDrafter(nn.Module):
    """The EAGLE-3.1 step in the style of transformers' modeling_llama (one layer, fan-in 2H)."""

    def __init__(self, state: dict[str, torch.Tensor], c: DrafterConfig):
        super().__init__()
        self.c = c
        p = "layers.0."
        self.fc = _linear(state["fc.weight"])
        self.fc_norm = nn.ModuleList(RMSNorm(state[f"fc_norm.{k}.weight"], c.rms_norm_eps)
                                     for k in range(c.num_aux_hidden_states))
        self.q_proj, self.k_proj, self.v_proj, self.o_proj = (
            _linear(state[p + f"self_attn.{n}_proj.weight"]) for n in "qkvo")
        self.gate_proj, self.up_proj, self.down_proj = (_linear(state[p + f"mlp.{n}_proj.weight"])
                                                        for n in ("gate", "up", "down"))
        self.input_layernorm = RMSNorm(state[p + "input_layernorm.weight"], c.rms_norm_eps)
        self.hidden_norm = RMSNorm(state[p + "hidden_norm.weight"], c.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(state[p + "post_attention_layernorm.weight"], c.rms_norm_eps)
        self.norm = RMSNorm(state["norm.weight"], c.rms_norm_eps)
        self.lm_head = _linear(state["lm_head.weight"])
        self.embed_tokens = nn.Embedding.from_pretrained(state["embed_tokens.weight"].clone())
        self.register_buffer("d2t", state["d2t"].clone())
        self.register_buffer("inv_freq", 1.0 / (c.rope_theta ** (torch.arange(0, c.head_dim, 2).float() / c.head_dim)))

    def combine(self, aux: torch.Tensor) -> torch.Tensor:
        chunks = aux.chunk(self.c.num_aux_hidden_states, dim=-1)
        return self.fc(torch.cat([norm(chunk) for norm, chunk in zip(self.fc_norm, chunks)], dim=-1))

    def rotary(self, position_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        freqs = (self.inv_freq[None, :, None].expand(position_ids.shape[0], -1, 1) @ position_ids[:, None, :].float())
        emb = torch.cat((freqs.transpose(1, 2), freqs.transpose(1, 2)), dim=-1)
        return emb.cos(), emb.sin()

    def forward(self, input_ids, hidden, position_ids, past: tuple[torch.Tensor, torch.Tensor] | None):
        b, s, _ = hidden.shape
        c = self.c
        x = torch.cat([self.input_layernorm(self.embed_tokens(input_ids)), self.hidden_norm(hidden)], dim=-1)
        residual = hidden
        q = self.q_proj(x).view(b, s, c.num_heads, c.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(b, s, c.num_kv_heads, c.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(b, s, c.num_kv_heads, c.head_dim).transpose(1, 2)
        cos, sin = self.rotary(position_ids)
        cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
        q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
        if past is not None:
            k, v = torch.cat([past[0], k], dim=2), torch.cat([past[1], v], dim=2)
        groups = c.num_heads // c.num_kv_heads
        k_all, v_all = (t[:, :, None].expand(b, c.num_kv_heads, groups, t.shape[2], c.head_dim)
                        .reshape(b, c.num_heads, -1, c.head_dim) for t in (k, v))
        mask = None
        if s > 1:
            total = k.shape[2]
            mask = torch.ones(s, total, dtype=torch.bool).tril(total - s)
        attn = F.scaled_dot_product_attention(q, k_all, v_all, attn_mask=mask)
        h = self.o_proj(attn.transpose(1, 2).reshape(b, s, -1)) + residual
        residual = h
        h = self.post_attention_layernorm(h)
        h = self.down_proj(F.silu(self.gate_proj(h)) * self.up_proj(h)) + residual
        y = self.norm(h)
        draft = self.lm_head(y)
        logits = draft.new_full((b, s, c.vocab_size), float("-inf"))
        logits[..., torch.arange(c.draft_vocab_size) + self.d2t] = draft
        return logits, y, (k, v)


def paired_medians(mine: Callable[[], object], theirs: Callable[[], object], repeats: int) -> tuple[float, float]:
    """Median ms of each, timed alternately so that load from other processes hits both alike."""
    for _ in range(3):
        mine()
        theirs()
    times: tuple[list[float], list[float]] = ([], [])
    for _ in range(repeats):
        for run, bucket in ((mine, times[0]), (theirs, times[1])):
            start = time.perf_counter()
            run()
            bucket.append(time.perf_counter() - start)
    return statistics.median(times[0]) * 1e3, statistics.median(times[1]) * 1e3


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--threads", type=int, default=0, help="torch threads (default: torch's choice)")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    c = CONFIG
    drafter = Drafter(c).eval()
    kept = torch.randperm(c.vocab_size)[: c.draft_vocab_size].sort().values
    drafter.d2t.copy_(kept - torch.arange(c.draft_vocab_size))
    with torch.no_grad():
        for module in (drafter.fc_norm, drafter.layers[0].input_layernorm, drafter.layers[0].hidden_norm, drafter.norm):
            for weight in module.parameters():
                weight.uniform_(0.8, 1.2)
    baseline = HfStyleDrafter(drafter.state_dict(), c).eval()

    context, gen = 128, torch.Generator().manual_seed(1)
    with torch.no_grad():
        rows = [row for batch in (1, 8) for row in compare(drafter, baseline, batch, context, args.repeats, gen)]
    print(f"CPU drafter step, SmolLM2-shaped EAGLE-3.1 draft (H=576, K=3, Vd=8192, V=49152), fp32, "
          f"{torch.get_num_threads()} threads, median wall clock")
    print(f"{'scenario':40} {'eaglekit ms':>12} {'HF-style ms':>12} {'HF / eaglekit':>14}")
    for name, mine, theirs in rows:
        print(f"{name:40} {mine:12.2f} {theirs:12.2f} {theirs / mine:14.2f}")
    return 0


def compare(drafter: Drafter, baseline: HfStyleDrafter, batch: int, context: int, repeats: int,
            gen: torch.Generator) -> list[tuple[str, float, float]]:
    """Check that both agree, then time a prefill of `context` tokens and one decode step after it."""
    c = drafter.config
    aux = torch.randn(batch, context, c.num_aux_hidden_states * c.target_hidden_size, generator=gen)
    ids = torch.randint(0, c.vocab_size, (batch, context + 1), generator=gen)
    pos = torch.arange(context + 1).expand(batch, -1)
    cache = drafter.new_cache(batch, context + 1)
    ours = drafter(ids[:, :context], drafter.combine(aux), pos[:, :context], cache)
    logits, _, past = baseline(ids[:, :context], baseline.combine(aux), pos[:, :context], None)
    _check(ours.logits, logits, "prefill logits")
    step_hidden = ours.feedback[:, -1:]
    _check(drafter(ids[:, context:], step_hidden, pos[:, context:], cache).logits,
           baseline(ids[:, context:], step_hidden, pos[:, context:], past)[0], "decode logits")

    def ours_prefill():  # .logits: both sides build the target-vocabulary logits, as vLLM does
        return drafter(ids[:, :context], drafter.combine(aux), pos[:, :context],
                       drafter.new_cache(batch, context + 1)).logits

    def base_prefill():
        return baseline(ids[:, :context], baseline.combine(aux), pos[:, :context], None)

    def ours_step():
        cache.truncate(context)
        return drafter(ids[:, context:], step_hidden, pos[:, context:], cache).logits

    def base_step():
        return baseline(ids[:, context:], step_hidden, pos[:, context:], past)

    return [(f"prefill {context} tokens, batch {batch}", *paired_medians(ours_prefill, base_prefill,
                                                                          max(5, repeats // 3))),
            (f"decode step at context {context}, batch {batch}", *paired_medians(ours_step, base_step, repeats))]


def _check(ours: torch.Tensor, theirs: torch.Tensor, what: str) -> None:
    finite = torch.isfinite(theirs)
    if not torch.equal(finite, torch.isfinite(ours)):
        raise SystemExit(f"{what}: the two implementations disagree on the draft vocabulary")
    err = float((ours[finite] - theirs[finite]).abs().max() / theirs[finite].abs().max())
    if err > 1e-4:
        raise SystemExit(f"{what}: the two implementations disagree (max relative error {err:.1e})")


if __name__ == "__main__":
    sys.exit(main())
