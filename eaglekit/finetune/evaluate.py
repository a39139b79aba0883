"""Held-out acceptance before and after training: verify's own speculative decode on prompts never trained on.

Greedy speculative decoding is lossless by construction (and verify proves it on the same loop), so only the
speculative pass runs here: τ and the per-position rates come from vLLM's counter definitions
(eaglekit.verify.metrics), for a short-prompt setting and a long-context one.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from eaglekit.verify.decode import LiveVerifier, speculative_decode
from eaglekit.verify.eagle import EagleProposer
from eaglekit.verify.metrics import AcceptanceCounter
from eaglekit.verify.prompts import Prompt, bundled_prompts, encode, read_prompts


@dataclass(frozen=True)
class EvalOptions:
    prompts_file: str | None = None  # default: verify's bundled coding prompts (not in the training prompts)
    limit: int = 8
    max_new_tokens: int = 64
    k: int = 3
    context_tokens: tuple[int, ...] = (0, 1024)  # one setting per entry; 0 = the prompts as they are


@dataclass
class Acceptance:
    context_tokens: int
    prompts: int
    acceptance_length: float
    per_position: list[float]
    drafts: int

    @classmethod
    def of(cls, counter: AcceptanceCounter, context_tokens: int, prompts: int) -> Acceptance:
        return cls(context_tokens, prompts, counter.acceptance_length, counter.per_position, counter.drafts)

    def to_dict(self) -> dict[str, Any]:
        return {"context_tokens": self.context_tokens, "prompts": self.prompts,
                "acceptance_length": round(self.acceptance_length, 4),
                "per_position_acceptance": [round(r, 4) for r in self.per_position], "drafts": self.drafts}


def held_out_prompts(opts: EvalOptions) -> tuple[str, tuple[Prompt, ...]]:
    prompts = read_prompts(opts.prompts_file) if opts.prompts_file else bundled_prompts()
    return prompts.name, prompts.prompts[: opts.limit]


def acceptance(target, drafter, aux_ids: Sequence[int], prompts: Sequence[Prompt], opts: EvalOptions,
               context_tokens: int, *, on_prompt: Callable[[int, int], None] | None = None) -> Acceptance:
    """τ of `drafter` on `prompts` with `context_tokens` of verify's long context prepended."""
    import torch

    counter = AcceptanceCounter(opts.k)
    eos = target.eos_token_ids
    was_training = drafter.training
    drafter.eval()
    try:
        with torch.no_grad():
            for i, prompt in enumerate(prompts):
                ids = encode(prompt, target.tokenizer, context_tokens=context_tokens, index=i)
                proposer = EagleProposer(drafter, aux_ids, max_len=len(ids) + opts.max_new_tokens + opts.k + 2)
                run = speculative_decode(LiveVerifier(target, aux_ids), proposer, ids, k=opts.k,
                                         max_new_tokens=opts.max_new_tokens, eos_ids=eos)
                counter.merge(run.counter)
                if on_prompt:
                    on_prompt(i + 1, len(prompts))
    finally:
        drafter.train(was_training)
    return Acceptance.of(counter, context_tokens, len(prompts))
