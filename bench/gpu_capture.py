"""Hidden-state capture through vLLM (`capture --engine vllm`'s backend) on a large target: tokens/s, and a sample
checked against the reference hooks.

    python bench/gpu_capture.py /models/Llama-3.1-8B-Instruct                     # CUDA, bf16, 256 x 1024 tokens
    python bench/gpu_capture.py MODEL --sequences 1024 --length 2048 --tensor-parallel-size 2
    python bench/gpu_capture.py .cache/smollm2 --dtype float32 --sequences 32 --length 256   # the same on a CPU

vLLM runs in `--python` (default EAGLEKIT_VLLM_PYTHON, else this Python); eaglekit, torch and transformers must
import here. The sequences are the bundled calibration text, tokenised by the target's tokenizer and cut into
windows of `--length` tokens. The layer ids are the target's default aux ids (2, L//2, L-3) and L. What is timed:
vLLM's generate calls over all sequences (the engine start is printed apart), and the whole capture as the caller
sees it, against the token count. After vLLM has stopped,
`--check` sequences go through the reference (eaglekit's target model, transformers with hooks, on the same
device and dtype) and every captured state must agree per token with cosine at least `--min-cosine` (bf16
rounds differently in the two stacks, so 0.99 by default; float32 gives above 0.9999). Prints the figures and
exits 1 when a state disagrees.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("model", help="local Hugging Face model directory")
    p.add_argument("--sequences", type=int, default=256)
    p.add_argument("--length", type=int, default=1024, help="tokens per sequence")
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--python", default=None, help="the Python that has vLLM")
    p.add_argument("--tensor-parallel-size", type=int, default=1)
    p.add_argument("--check", type=int, default=4, help="sequences checked against the reference")
    p.add_argument("--min-cosine", type=float, default=0.99)
    p.add_argument("--device", default=None, help="the reference's device (default cuda when present, else cpu)")
    return p.parse_args(argv)


def sequences_of(model: str, count: int, length: int) -> list[list[int]]:
    """Windows of the calibration text, repeated as often as `count` x `length` needs, each starting elsewhere."""
    from eaglekit.target import read_target
    from eaglekit.target_model import load_tokenizer

    tokenizer = load_tokenizer(model, read_target(model))
    if tokenizer is None:
        raise SystemExit(f"{model}: no tokenizer")
    with open(os.path.join(REPO, "eaglekit", "data", "calibration.txt"), encoding="utf-8") as fh:
        ids = tokenizer(fh.read())["input_ids"]
    ids = ids * (-(-(length + count) // len(ids)) + 1)
    return [ids[i:i + length] for i in range(count)]


def main(argv=None) -> int:
    args = parse_args(argv)
    import torch

    from eaglekit.capture.vllm_engine import capture_with_vllm
    from eaglekit.target import read_target
    from eaglekit.target_model import load_target

    info = read_target(args.model)
    layer_ids = sorted({*info.default_aux_ids, info.num_layers})
    sequences = sequences_of(args.model, args.sequences, args.length)
    tokens = args.sequences * args.length
    started = time.perf_counter()
    capture = capture_with_vllm(args.model, sequences, layer_ids, python=args.python, dtype=args.dtype,
                                tensor_parallel_size=args.tensor_parallel_size)
    sample = []
    for record in capture:
        if record.index < args.check:
            sample.append(record)
    ended = time.perf_counter()
    timings = capture.timings
    print(f"vLLM {capture.version}: {args.sequences} sequences x {args.length} tokens, layer ids {layer_ids}, "
          f"{args.dtype}, tensor parallel {args.tensor_parallel_size}")
    print(f"engine start {timings['init_s']:.1f} s; generate {timings['generate_s']:.1f} s = "
          f"{tokens / timings['generate_s']:,.0f} tokens/s; wall {ended - started:.1f} s = "
          f"{tokens / (ended - started):,.0f} tokens/s (probe, engine start, reading and shutdown included)")

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    target = load_target(args.model, device=device, dtype=args.dtype)
    worst: dict[int, float] = {}
    reference_s = 0.0
    for record in sample:
        tick = time.perf_counter()
        result = target.forward(torch.tensor([list(record.token_ids)], device=device), layer_ids, logits_to_keep=1)
        reference_s += time.perf_counter() - tick
        for i, state in zip(layer_ids, result.aux):
            cosine = torch.nn.functional.cosine_similarity(record.states[i].float(), state[0].float().cpu(), dim=-1)
            worst[i] = min(worst.get(i, 1.0), float(cosine.min()))
    checked = sum(len(r.token_ids) for r in sample)
    print(f"reference ({device}, one sequence at a time): {checked / reference_s:,.0f} tokens/s over {len(sample)} "
          f"sequences")
    print("min cosine per layer id: " + ", ".join(f"{i}: {c:.6f}" for i, c in sorted(worst.items())))
    bad = {i: c for i, c in worst.items() if c < args.min_cosine}
    if bad:
        print(f"FAIL: below {args.min_cosine} at layer ids {sorted(bad)}")
        return 1
    print("OK")
    return 0


if __name__ == "__main__":
    sys.exit(main())
