"""Time one draft step of an 8B-class drafter on a CUDA device against its memory-bandwidth floor.

The drafter is random (built in memory, nothing read from disk) at the shape of a Llama-3.1-8B
EAGLE-3.1 draft: H = T = 4096, I = 14336, 32 query / 8 KV heads of 128, K = 3, Vd = 32000 of
V = 128256, bf16, fc_norm + norm_output, batch 1, after a prompt of `context` tokens. Two steps are
timed: the first of a round (combine: fc_norm + fc, then the layer) and a later one (fed-back
state). Each figure is the median of `iters` CUDA-event measurements after warm-up, eager and as a
CUDA-graph replay, with the fused Triton kernels and with the plain torch path. The floor is the
bytes the step must read (weights it touches, one embedding row, the KV cache) over 4.3e12 B/s; the
step's weight matmuls alone are timed too, to show how much of the step is cuBLAS's.

    python -m eaglekit.drafter.bench [--iters 200] [--context 1024]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, cast

import torch

from eaglekit.drafter.attention import GqaAttention
from eaglekit.drafter.config import DrafterConfig
from eaglekit.drafter.kernels import BACKEND_ENV
from eaglekit.drafter.model import DecoderLayer, Drafter

HBM_BYTES_PER_S = 4.3e12
WARMUP = 10
SHAPE: dict[str, Any] = dict(
    hidden_size=4096, target_hidden_size=4096, intermediate_size=14336, num_layers=1, num_heads=32, num_kv_heads=8,
    head_dim=128, num_aux_hidden_states=3, vocab_size=128256, draft_vocab_size=32000, rms_norm_eps=1e-5,
    rope_theta=500000.0, fc_norm=True, norm_output=True,
    rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                  "original_max_position_embeddings": 8192})


def build_drafter(device: str = "cuda", seed: int = 0) -> Drafter:
    """A random 8B-class EAGLE-3.1 drafter in bf16, sharing a random target embedding."""
    torch.manual_seed(seed)
    config = DrafterConfig(**SHAPE)
    embed = torch.randn(config.vocab_size, config.hidden_size, device=device, dtype=torch.bfloat16) * 0.02
    drafter = Drafter(config, device=device, dtype=torch.bfloat16, embed_tokens=embed)
    ids = torch.randperm(config.vocab_size, device=device)[: config.draft_vocab_size].sort().values
    assert drafter.d2t is not None, "SHAPE's draft vocabulary is smaller than the target's"
    drafter.d2t.copy_(ids - torch.arange(config.draft_vocab_size, device=device))
    return drafter.eval()


def floor_bytes(drafter: Drafter, context: int, first: bool) -> int:
    """Bytes one step must move at batch 1: the weights it reads, one embedding row, the KV cache, d2t."""
    c = drafter.config

    def size(module: torch.nn.Module) -> int:
        return sum(p.numel() * p.element_size() for p in module.parameters())

    total = size(drafter.layers) + size(drafter.norm) + drafter.head_weight.numel() * drafter.head_weight.element_size()
    total += c.hidden_size * drafter.embedding_weight.element_size()
    if drafter.d2t is not None:
        total += drafter.d2t.numel() * drafter.d2t.element_size()
    total += 2 * (context + 1) * c.num_kv_heads * c.head_dim * 2 * c.num_layers
    if first:
        total += sum(size(module) for module in (drafter.fc, drafter.fc_norm) if module is not None)
    return total


@contextmanager
def kernel_backend(name: str) -> Iterator[None]:
    previous = os.environ.get(BACKEND_ENV)
    os.environ[BACKEND_ENV] = name
    try:
        yield
    finally:
        if previous is None:
            os.environ.pop(BACKEND_ENV, None)
        else:
            os.environ[BACKEND_ENV] = previous


def _median_us(run: Callable[[], object], iters: int, reset: Callable[[], None]) -> float:
    for _ in range(WARMUP):
        run()
        reset()
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
    for start, end in zip(starts, ends):
        start.record()
        run()
        end.record()
        reset()
    torch.cuda.synchronize()
    return statistics.median(s.elapsed_time(e) for s, e in zip(starts, ends)) * 1000.0


def _graphed(run: Callable[[], torch.Tensor], reset: Callable[[], None]) -> tuple[Callable[[], None], torch.Tensor]:
    """Capture `run` once (after warm-up on a side stream); replays rewrite the same cache slot."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):
            run()
            reset()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = run()
    reset()
    return graph.replay, out


def bench_drafter_step(iters: int = 200, context: int = 1024, seed: int = 0) -> dict:
    """Print a table of step times vs the bandwidth floor and return the figures as a JSON-ready dict."""
    if not torch.cuda.is_available():
        print("drafter step: no CUDA device, nothing to measure")
        return {"measured": False}
    drafter = build_drafter("cuda", seed)
    c = drafter.config
    gen = torch.Generator(device="cuda").manual_seed(seed)
    prompt_ids = torch.randint(0, c.vocab_size, (1, context), device="cuda", generator=gen)
    prompt_aux = torch.randn(1, context, c.num_aux_hidden_states * c.target_hidden_size, device="cuda",
                             dtype=torch.bfloat16, generator=gen)
    step_ids = torch.randint(0, c.vocab_size, (1, 1), device="cuda", generator=gen)
    step_aux = prompt_aux[:, -1:].clone()
    step_pos = torch.full((1, 1), context, device="cuda", dtype=torch.long)
    cache = drafter.new_cache(1, context + 1)
    with torch.no_grad():
        prompt = drafter(prompt_ids, drafter.combine(prompt_aux), torch.arange(context, device="cuda")[None], cache)
    feedback = prompt.feedback[:, -1:].clone()

    def first() -> torch.Tensor:
        return drafter(step_ids, drafter.combine(step_aux), step_pos, cache).logits

    def later() -> torch.Tensor:
        return drafter(step_ids, feedback, step_pos, cache).logits

    def reset() -> None:
        cache.truncate(context)

    floors = {name: floor_bytes(drafter, context, name == "first") / HBM_BYTES_PER_S * 1e6
              for name in ("first", "later")}
    report: dict[str, Any] = {
        "measured": True, "device": torch.cuda.get_device_name(), "iters": iters, "context": context,
        "shape": {k: v for k, v in SHAPE.items() if k != "rope_scaling"}, "dtype": "bfloat16",
        "hbm_bytes_per_s": HBM_BYTES_PER_S, "floor_us": floors, "runs": []}
    with torch.no_grad():
        outputs = {}
        for backend in ("triton", "torch"):
            with kernel_backend(backend):
                outputs[backend] = {name: _once(step, reset) for name, step in (("first", first), ("later", later))}
        report["triton_vs_torch_max_rel"] = {
            name: _max_rel(outputs["triton"][name], outputs["torch"][name]) for name in ("first", "later")}
        report["matmuls_only_us"] = _matmuls_only_us(drafter, iters)
        for backend in ("triton", "torch"):
            with kernel_backend(backend):
                for name, step in (("first", first), ("later", later)):
                    report["runs"].append(_time_step(backend, name, step, reset, iters, floors[name],
                                                     outputs[backend][name]))
    _print_table(report)
    return report


def _matmuls_only_us(drafter: Drafter, iters: int) -> dict:
    """The step's weight matmuls alone, as one graph replay: the part of the step that is cuBLAS's."""
    layer, h = cast(DecoderLayer, drafter.layers[0]), drafter.config.hidden_size
    attn, fc = cast(GqaAttention, layer.self_attn), drafter.fc
    assert fc is not None, "SHAPE's draft combines aux states through fc"
    x = torch.randn(1, h, device="cuda", dtype=torch.bfloat16)
    attn_in = torch.randn(1, 2 * h, device="cuda", dtype=torch.bfloat16)
    inner = torch.randn(1, drafter.config.intermediate_size, device="cuda", dtype=torch.bfloat16)
    heads = torch.randn(1, attn.o_proj.in_features, device="cuda", dtype=torch.bfloat16)
    aux = torch.randn(1, fc.in_features, device="cuda", dtype=torch.bfloat16)

    def later() -> torch.Tensor:
        attn.qkv_proj(attn_in)
        attn.o_proj(heads)
        layer.mlp.gate_up_proj(x)
        layer.mlp.down_proj(inner)
        return torch.nn.functional.linear(x, drafter.head_weight)

    def first() -> torch.Tensor:
        fc(aux)
        return later()

    def nothing() -> None:
        return None

    out = {}
    for name, run in (("first", first), ("later", later)):
        replay, _ = _graphed(run, nothing)
        out[name] = _median_us(replay, iters, nothing)
    return out


def _once(step: Callable[[], torch.Tensor], reset: Callable[[], None]) -> torch.Tensor:
    out = step().float()
    reset()
    return out


def _time_step(backend: str, name: str, step: Callable[[], torch.Tensor], reset: Callable[[], None], iters: int,
               floor: float, eager_out: torch.Tensor) -> dict:
    run = {"kernels": backend, "step": name, "eager_us": _median_us(step, iters, reset), "graph_us": None,
           "graph_vs_eager_max_rel": None, "graph_error": None, "floor_us": floor}
    try:
        replay, out = _graphed(step, reset)
        run["graph_us"] = _median_us(replay, iters, reset)
        replay()
        reset()
        run["graph_vs_eager_max_rel"] = _max_rel(out.float(), eager_out)
    except RuntimeError as error:  # capture is best effort: report why it failed
        run["graph_error"] = str(error).splitlines()[0]
    return run


def _max_rel(a: torch.Tensor, b: torch.Tensor) -> float:
    """max |a - b| / max |b| over the finite entries of b (logits are -inf outside the draft vocabulary)."""
    finite = torch.isfinite(b)
    return float((a[finite] - b[finite]).abs().max() / b[finite].abs().max())


def _print_table(report: dict) -> None:
    rel = report["triton_vs_torch_max_rel"]
    print(f"drafter step on {report['device']}: 8B-class EAGLE-3.1 draft, bf16, batch 1, context {report['context']}, "
          f"median of {report['iters']}; floor = bytes read / {HBM_BYTES_PER_S / 1e12:.1f} TB/s; triton vs torch "
          f"logits max rel diff: first {rel['first']:.1e}, later {rel['later']:.1e}")
    mm = report["matmuls_only_us"]
    print(f"weight matmuls alone (graph): first {mm['first']:.1f} us, later {mm['later']:.1f} us")
    print(f"{'kernels':8} {'step':6} {'eager us':>9} {'graph us':>9} {'floor us':>9} {'graph/floor':>11}")
    for r in report["runs"]:
        graph = f"{r['graph_us']:9.1f}" if r["graph_us"] is not None else f"{'failed':>9}"
        ratio = f"{r['graph_us'] / r['floor_us']:11.2f}" if r["graph_us"] is not None else f"{'-':>11}"
        print(f"{r['kernels']:8} {r['step']:6} {r['eager_us']:9.1f} {graph} {r['floor_us']:9.1f} {ratio}"
              + (f"  graph capture failed: {r['graph_error']}" if r["graph_error"] else ""))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iters", type=int, default=200)
    parser.add_argument("--context", type=int, default=1024)
    parser.add_argument("--json", metavar="OUT", help="also write the figures as JSON to OUT")
    args = parser.parse_args(argv)
    report = bench_drafter_step(args.iters, args.context)
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(report, fh, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
