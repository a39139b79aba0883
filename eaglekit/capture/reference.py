"""The reference capture backend: the target loaded with transformers in this process, states from its hooks.

Exact and simple, for targets that fit one device; the serving engine backend (eaglekit.capture.vllm_engine)
yields the same records for any target vLLM serves."""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from eaglekit.capture.sequence import CapturedSequence


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
