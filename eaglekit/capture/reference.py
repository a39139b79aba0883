"""The reference capture backend: the target loaded with transformers in this process, states from its hooks
(and, for `--generate`, its greedy answers).

Exact and simple, for targets that fit one device; the serving engine backend (eaglekit.capture.vllm_engine)
yields the same records for any target vLLM serves."""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from eaglekit.capture.sequence import CapturedSequence
from eaglekit.progress import Progress, quiet


def capture_with_reference(target, sequences: Sequence[Sequence[int]], layer_ids: Sequence[int]
                           ) -> Iterator[CapturedSequence]:
    """One target pass per sequence, in order; `target` is a loaded eaglekit.target_model.TargetModel. Record i
    holds sequence i's states at `layer_ids` (vLLM convention), float32 on the CPU."""
    import torch

    ids = target.check_aux_ids(layer_ids)
    for index, seq in enumerate(sequences):
        result = target.forward(torch.tensor([list(seq)], dtype=torch.long), ids, logits_to_keep=1)
        states = {i: state[0].to("cpu", torch.float32) for i, state in zip(ids, result.aux)}
        yield CapturedSequence(index=index, token_ids=tuple(int(t) for t in seq), states=states)


def left_padded(prompts: Sequence[Sequence[int]], pad: int):
    """(input ids, attention mask) [B, W] of prompts padded on the left, as batched generation wants them."""
    import torch

    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad, dtype=torch.long)
    mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for row, prompt in enumerate(prompts):
        ids[row, width - len(prompt):] = torch.tensor(prompt)
        mask[row, width - len(prompt):] = 1
    return ids, mask


def generate_answers(target, prompts: list[list[int]], max_new_tokens: int, *, batch_tokens: int = 8192,
                     progress: Progress | None = None) -> list[list[int]]:
    """The target's greedy continuation of each prompt (left-padded batches of similar length); `progress` counts
    the tokens of every sequence as each generate step makes them, not only when a batch ends."""
    import torch
    from transformers import StoppingCriteria, StoppingCriteriaList

    sink = quiet(progress)
    sink.stage(f"generating answers to {len(prompts):,} prompts", len(prompts) * max_new_tokens, "tokens")

    class EveryStep(StoppingCriteria):  # called once per generated token of the batch: it only reports
        def __call__(self, input_ids, scores, **kwargs):
            sink.advance(int(input_ids.shape[0]))
            return torch.zeros(input_ids.shape[0], dtype=torch.bool, device=input_ids.device)

    eos = sorted(target.eos_token_ids)
    pad = eos[0] if eos else 0
    order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))
    answers: list[list[int]] = [[] for _ in prompts]
    done = 0
    while done < len(order):
        width = len(prompts[order[done]]) + max_new_tokens
        size = max(1, batch_tokens // width)
        idx = order[done : done + size]
        ids, mask = left_padded([prompts[i] for i in idx], pad)
        width = ids.shape[1]
        with torch.inference_mode():
            out = target.model.generate(input_ids=ids.to(target.device), attention_mask=mask.to(target.device),
                                        max_new_tokens=max_new_tokens, do_sample=False, pad_token_id=pad,
                                        eos_token_id=eos or None, temperature=None, top_p=None, top_k=None,
                                        stopping_criteria=StoppingCriteriaList([EveryStep()]))
        for row, i in enumerate(idx):
            tokens = out[row, width:].tolist()
            stop = next((n for n, t in enumerate(tokens) if t in eos), None)
            answers[i] = tokens if stop is None else tokens[: stop + 1]
        done += len(idx)
        sink.advance(len(idx) * max_new_tokens - len(idx) * (out.shape[1] - width))  # rows stopped early
    sink.done()
    return answers
