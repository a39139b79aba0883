"""Sampled speculative decoding as vLLM does it (vllm/v1/sample/rejection_sampler.py, vLLM 0.32).

The EAGLE proposer drafts argmax tokens whatever the request's temperature (vLLM's default
`draft_sample_method="greedy"`), so the rejection sampler holds no draft probabilities and treats each draft as
one-hot. The target's rows are scaled by 1/T, cut to the top-p nucleus and softmaxed in float32; a draft x is
accepted when p(x) >= u, u uniform in [0, 1); the first rejected one is replaced by a token drawn from p with x
removed (the residual max(p - onehot(x), 0), normalised); when all k are accepted the bonus token is drawn from
the last row. Draws are exponential races (argmax of p / q, q ~ Exp(1)), as vLLM draws them. Temperatures below
1e-5 are greedy (vLLM's `_SAMPLING_EPS`), and greedy decoding never reaches this module.

With one-hot drafts this is the same law as drawing the target's own token y ~ p at each row and accepting the
draft iff y == x (P[accept] = p(x); given a rejection, y ~ p(y) / (1 - p(x)) off x = the normalised residual).
So replaying drafts with the greedy match rule against a continuation the target sampled measures the same
acceptance distribution; compare and --diagnose rely on that.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from eaglekit.errors import UsageError

GREEDY_BELOW = 1e-5
"""vLLM samples greedily below this temperature (vllm/sampling_params.py `_SAMPLING_EPS`)."""
DEFAULT_SEED = 0
SEED_RANGE = (-(2**63), 2**64 - 1)  # what torch.Generator.manual_seed takes (both ends included)
SEED_RANGE_TEXT = "torch takes seeds from -2^63 to 2^64 - 1"


@dataclass(frozen=True)
class Sampling:
    """How the target's tokens are chosen: greedy (the default) or sampled at a temperature and top-p, seeded."""

    temperature: float = 0.0
    top_p: float = 1.0
    seed: int = DEFAULT_SEED

    @property
    def greedy(self) -> bool:
        return self.temperature < GREEDY_BELOW

    def check(self) -> None:
        if not math.isfinite(self.temperature) or self.temperature < 0:
            raise UsageError(f"--temperature {self.temperature}: expected a finite number, at least 0 (0: greedy)")
        if not math.isfinite(self.top_p) or not 0 < self.top_p <= 1:
            raise UsageError(f"--top-p {self.top_p}: expected a number in (0, 1]")
        if self.greedy and self.top_p < 1:
            raise UsageError(f"--top-p {self.top_p} at temperature {self.temperature}: a greedy decode ignores "
                             "top-p (vLLM resets it to 1); give --temperature above 0 to sample")

    def to_dict(self) -> dict[str, Any]:
        """What the reports record; the seed only where it chose anything."""
        return {"temperature": self.temperature, "top_p": self.top_p, "seed": None if self.greedy else self.seed}

    @property
    def label(self) -> str:
        if self.greedy:
            return "greedy"
        return f"temperature {self.temperature:g}, top-p {self.top_p:g}, seed {self.seed}"

    @property
    def sample_note(self) -> str:
        """What a sampled run's acceptance figures are, for its output."""
        return (f"sampled ({self.label}): τ and per-position acceptance are one draw of their expectation over the "
                f"sampling, reproducible with --seed {self.seed} (another seed draws others)")


def target_probabilities(logits, sampling: Sampling):
    """Rows of logits [n, V] as vLLM's sampler turns them into probabilities: float32, divided by the temperature,
    then the top-p nucleus (vllm/v1/sample/ops/topk_topp_sampler.py `apply_top_k_top_p_pytorch`: sorted ascending,
    a token is cut when the cumulative probability up to it is at most 1 - p; the most likely always stays)."""
    import torch

    scaled = logits.float() / sampling.temperature
    if sampling.top_p < 1:
        ordered, order = scaled.sort(dim=-1, descending=False)
        cut = ordered.softmax(dim=-1).cumsum(dim=-1) <= 1 - sampling.top_p
        cut[..., -1] = False
        scaled = scaled.scatter(-1, order, ordered.masked_fill(cut, -float("inf")))
    return torch.softmax(scaled, dim=-1)


class RejectionSampler:
    """vLLM's rejection sampling of one request, drawn from its own seeded generator (on the CPU, so a seed gives
    the same draws on every device)."""

    def __init__(self, sampling: Sampling):
        import torch

        if sampling.greedy:
            raise ValueError("a greedy decode takes the argmax path, not a sampler")
        self.sampling = sampling
        self.generator = torch.Generator().manual_seed(sampling.seed)

    def _draw(self, probs) -> int:
        import torch

        noise = torch.empty(probs.shape, dtype=torch.float32).exponential_(generator=self.generator)
        return int((probs / noise).argmax())

    def sample(self, logits_row) -> int:
        """One token from the target's row, as vLLM's sampler draws it (the first token, the target alone)."""
        return self._draw(target_probabilities(logits_row.detach().cpu(), self.sampling))

    def judge(self, drafts: Sequence[int], rows) -> tuple[int, int]:
        """One verify round: `rows` [k+1, V] are the target's logits after the last token and after each draft.
        Returns how many drafts are accepted and the token emitted after them (recovered or bonus)."""
        import torch

        probs = target_probabilities(rows[: len(drafts) + 1].detach().cpu(), self.sampling)
        uniform = torch.rand(len(drafts), dtype=torch.float64, generator=self.generator)
        for position, draft in enumerate(drafts):
            if float(probs[position, draft]) < float(uniform[position]):
                residual = probs[position].clone()
                residual[draft] = 0.0
                return position, self._draw(residual)
        return len(drafts), self._draw(probs[len(drafts)])


def sampler_for(sampling: Sampling) -> RejectionSampler | None:
    """A fresh sampler seeded from `sampling`, or None for a greedy decode (the exact argmax path)."""
    return None if sampling.greedy else RejectionSampler(sampling)
