"""Train an EAGLE-3 and an EAGLE-3.1 drafter for SmolLM2-135M-Instruct on CPU, with the same data and budget.

    python examples/train_tiny_drafter.py                      # both drafters into examples/drafters/
    python examples/train_tiny_drafter.py --steps 50 --out /tmp/drafters   # a quick smaller run

On 2 CPU cores: about 35 minutes once to generate and capture the data (cached in .cache/), then about
15 minutes per drafter for the default 500 steps.

Data: the target's own greedy answers to the bundled training prompts (eaglekit/data/prompts/train.jsonl),
a fifth of them with Python standard-library source prepended as long context, plus about 96 k tokens of
plain standard-library source (modules verify's long-context mode never uses). One float32 target pass over
each sequence records the aux hidden states (vLLM ids 2, 15, 27 = the engine default for L=30) and the
target's greedy token at every position, which is what the drafter learns to predict. The draft vocabulary
is the Vd most frequent of those tokens (d2t/t2d, sorted by target id).

Training follows EAGLE-3's training-time test: each batch is unrolled `--unroll` steps; step 0 reads the
target's states, step j reads the drafter's own output of step j-1 at the same row, and row i of step j sits
at position i+j and attends to the real prefix (rows <= i of step 0) plus its own earlier unroll steps, as a
chain draft does at inference. The EAGLE-3.1 drafter differs only in fc_norm and norm_output.

Output: the SpecForge export layout (LlamaForCausalLMEagle3, `midlayer.` names, eagle_config ids in its
output-of-layer convention, d2t + t2d, no embed_tokens, bf16), which inspect/validate/upgrade/verify read.
The script is deterministic for a given seed and machine (CPU float arithmetic aside).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shlex
import sys
import time
from importlib import resources
from types import SimpleNamespace

import numpy as np
import torch
from safetensors.torch import load_file, save_file

from eaglekit.drafter.config import DrafterConfig
from eaglekit.drafter.model import Drafter
from eaglekit.finetune.data import CODE_MODULES, code_sequences, left_padded
from eaglekit.finetune.train import TrainOptions
from eaglekit.finetune.train import train as run_training
from eaglekit.target_model import load_target
from eaglekit.decode.prompts import Prompt, encode, parse_jsonl
from smollm2 import materialize_smollm2

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
AUX_IDS = (2, 15, 27)  # vLLM convention; SpecForge writes them as output-of-layer ids 1, 14, 26
TRAIN_CONTEXT_MODULES = ("shutil", "tempfile", "logging", "glob", "fnmatch", "locale", "gettext", "tokenize",
                         "zipfile", "tarfile", "configparser", "optparse", "random", "timeit", "traceback", "copy")
DATA_VERSION = "2"


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--target", help="SmolLM2 model dir (default: materialise it into .cache/smollm2)")
    p.add_argument("--out", default=os.path.join(REPO, "examples", "drafters"))
    p.add_argument("--data-cache", default=os.path.join(REPO, ".cache", "tiny-drafter-data.safetensors"))
    p.add_argument("--variants", default="eagle3,eagle3.1", help="comma list of eagle3, eagle3.1")
    p.add_argument("--prompts", type=int, default=535, help="training prompts to use (of 535)")
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--context-every", type=int, default=5, help="every n-th prompt gets long context")
    p.add_argument("--context-tokens", type=int, default=384)
    p.add_argument("--code-tokens", type=int, default=96000, help="plain standard-library source to add (0: none)")
    p.add_argument("--code-chunk", type=int, default=512)
    p.add_argument("--draft-vocab", type=int, default=4096)
    p.add_argument("--intermediate", type=int, default=1024)
    p.add_argument("--steps", type=int, default=500)
    p.add_argument("--batch-tokens", type=int, default=2048)
    p.add_argument("--unroll", type=int, default=4)
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default="cpu", help="cpu (the default, minutes on a laptop) or cuda")
    return p.parse_args(argv)


# ------------------------------------------------------------------ data


def training_prompts_text() -> str:
    return resources.files("eaglekit").joinpath("data", "prompts", "train.jsonl").read_text(encoding="utf-8")


def training_prompts(count: int) -> list[Prompt]:
    return list(parse_jsonl(training_prompts_text(), "train.jsonl"))[:count]


def context_source(tokenizer, num_tokens: int, index: int) -> str:
    import importlib
    import inspect

    module = importlib.import_module(TRAIN_CONTEXT_MODULES[index % len(TRAIN_CONTEXT_MODULES)])
    ids = tokenizer.encode(inspect.getsource(module), add_special_tokens=False)
    start = (index * 97) % max(1, len(ids) - num_tokens)
    return tokenizer.decode(ids[start : start + num_tokens])


def encode_prompts(args, tokenizer) -> list[list[int]]:
    out = []
    for i, prompt in enumerate(training_prompts(args.prompts)):
        if args.context_every and i % args.context_every == 0:
            content = ("Here is some Python source code for reference:\n\n```python\n"
                       f"{context_source(tokenizer, args.context_tokens, i)}\n```\n\n{prompt.messages[-1]['content']}")
            prompt = Prompt(prompt.name, ({"role": "user", "content": content},), None)
        out.append(encode(prompt, tokenizer))
    return out


def generate(target_dir: str, prompts: list[list[int]], max_new_tokens: int, eos: int, device: str) -> list[list[int]]:
    """The target's greedy answers, batched (bf16 for speed; labels are recomputed in float32 below)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(target_dir, dtype=torch.bfloat16).to(device).eval()
    order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))
    answers: list[list[int]] = [[] for _ in prompts]
    batch = 25
    for start in range(0, len(order), batch):
        idx = order[start : start + batch]
        ids, mask = left_padded([prompts[i] for i in idx], eos)
        width = ids.shape[1]
        with torch.inference_mode():
            out = model.generate(input_ids=ids.to(device), attention_mask=mask.to(device),
                                 max_new_tokens=max_new_tokens, do_sample=False,
                                 pad_token_id=eos, eos_token_id=eos)
        for row, i in enumerate(idx):
            tokens = out[row, width:].tolist()
            answers[i] = tokens[: tokens.index(eos) + 1] if eos in tokens else tokens
        print(f"  generated {min(start + batch, len(order))}/{len(order)}", flush=True)
    return answers


def _cached(path: str, stamp: dict[str, str], build) -> dict[str, torch.Tensor]:
    """Load `path` when its metadata equals `stamp`, else build and save it (safetensors, never pickle)."""
    if os.path.exists(path):
        from safetensors import safe_open

        with safe_open(path, "pt") as fh:
            if fh.metadata() == stamp:
                print(f"data: reusing {path}")
                return load_file(path)
    data = build()
    os.makedirs(os.path.dirname(path), exist_ok=True)
    save_file(data, path, metadata=stamp)
    return data


def capture(target, sequences: list[list[int]]) -> dict[str, torch.Tensor]:
    """tokens, labels (the target's greedy token after each position), offsets, aux [N, K*T] (bf16)."""
    tokens, labels, aux, offsets = [], [], [], [0]
    for i, seq in enumerate(sequences):
        result = target.forward(torch.tensor([seq]), AUX_IDS)
        tokens.append(torch.tensor(seq))
        labels.append(result.logits[0].argmax(-1).cpu())
        aux.append(torch.cat([a[0] for a in result.aux], -1).to(torch.bfloat16).cpu())
        offsets.append(offsets[-1] + len(seq))
        if (i + 1) % 50 == 0:
            print(f"  captured {i + 1}/{len(sequences)}", flush=True)
    return {"tokens": torch.cat(tokens), "labels": torch.cat(labels), "aux": torch.cat(aux),
            "offsets": torch.tensor(offsets)}


def build_data(args, target_dir: str, target) -> dict[str, torch.Tensor]:
    """The target's answers to the chat prompts, plus plain source code; each part cached on disk."""
    stamp = {"version": DATA_VERSION, "prompts": str(args.prompts), "max_new_tokens": str(args.max_new_tokens),
             "context_every": str(args.context_every), "context_tokens": str(args.context_tokens),
             "aux_ids": ",".join(map(str, AUX_IDS)),
             "prompts_sha256": hashlib.sha256(training_prompts_text().encode()).hexdigest()}

    def chat():
        eos = target.model.config.eos_token_id
        prompts = encode_prompts(args, target.tokenizer)
        print(f"data: {len(prompts)} prompts, generating greedy answers (up to {args.max_new_tokens} tokens)")
        answers = generate(target_dir, prompts, args.max_new_tokens, eos, args.device)
        return capture(target, [p + a for p, a in zip(prompts, answers)])

    def code():
        sequences = code_sequences(target.tokenizer, args.code_tokens, args.code_chunk)
        print(f"data: {len(sequences)} chunks of standard-library source")
        return capture(target, sequences)

    parts = [_cached(args.data_cache, stamp, chat)]
    if args.code_tokens:
        code_stamp = {"version": DATA_VERSION, "aux_ids": stamp["aux_ids"], "code_tokens": str(args.code_tokens),
                      "code_chunk": str(args.code_chunk), "modules": ",".join(CODE_MODULES)}
        parts.append(_cached(args.data_cache.replace(".safetensors", "-code.safetensors"), code_stamp, code))
    offsets = [parts[0]["offsets"]]
    for part in parts[1:]:
        offsets.append(part["offsets"][1:] + offsets[-1][-1])
    return {"tokens": torch.cat([p["tokens"] for p in parts]), "labels": torch.cat([p["labels"] for p in parts]),
            "aux": torch.cat([p["aux"] for p in parts]), "offsets": torch.cat(offsets)}


def draft_vocabulary(labels: torch.Tensor, vocab: int, size: int) -> torch.Tensor:
    """The `size` most frequent target tokens among the labels, sorted by id (SpecForge convention)."""
    counts = torch.bincount(labels, minlength=vocab)
    top = torch.argsort(counts, descending=True, stable=True)[:size]
    chosen = torch.sort(top).values
    print(f"draft vocabulary: {size} tokens cover {counts[chosen].sum() / counts.sum():.1%} of the labels")
    return chosen


# ------------------------------------------------------------------ training


def train(args, data, variant: str, target, chosen: torch.Tensor) -> Drafter:
    """A fresh drafter warm-started from the target's head, trained by eaglekit's training-time-test loop."""
    torch.manual_seed(args.seed)
    cfg = target.model.config
    config = DrafterConfig(
        hidden_size=cfg.hidden_size, target_hidden_size=cfg.hidden_size, intermediate_size=args.intermediate,
        num_layers=1, num_heads=cfg.num_attention_heads, num_kv_heads=cfg.num_key_value_heads,
        head_dim=cfg.head_dim, num_aux_hidden_states=len(AUX_IDS), vocab_size=target.vocab_size,
        draft_vocab_size=len(chosen), rms_norm_eps=cfg.rms_norm_eps,
        rope_theta=float(cfg.rope_parameters["rope_theta"]), fc_norm=variant == "eagle3.1",
        norm_output=variant == "eagle3.1",
    )
    device = torch.device(args.device)
    drafter = Drafter(config, embed_tokens=target.embed_tokens, device=device)
    H = cfg.hidden_size
    with torch.no_grad():
        drafter.d2t.copy_((chosen - torch.arange(len(chosen))).to(device))
        # warm start: the target's head rows and final norm; fc reads the deepest aux state
        drafter.lm_head.weight.copy_(target.lm_head[chosen.to(target.lm_head.device)])
        drafter.norm.weight.copy_(target.model.model.norm.weight)
        drafter.fc.weight.zero_()
        drafter.fc.weight[:, -H:].copy_(torch.eye(H, device=device))
    opts = TrainOptions(steps=args.steps, batch_tokens=args.batch_tokens, depth=args.unroll, lr=args.lr,
                        seed=args.seed, log_every=25)
    began = time.time()

    def report(done, record, live):
        if record is not None:
            print(f"  {variant} step {done}/{args.steps}: loss {record.loss:.3f}, step-0 top-1 "
                  f"{record.accuracy[0]:.1%}, {time.time() - began:.0f} s", flush=True)

    run_training(drafter, SimpleNamespace(**data), opts, on_step=report)
    return drafter


# ------------------------------------------------------------------ export


def save_specforge(drafter: Drafter, chosen: torch.Tensor, target_dir: str, out_dir: str) -> None:
    """SpecForge export layout: midlayer. names, output-of-layer ids in eagle_config, d2t + t2d, bf16."""
    with open(os.path.join(target_dir, "config.json"), encoding="utf-8") as fh:
        tcfg = json.load(fh)
    c = drafter.config
    tensors = {}
    for name, value in drafter.state_dict().items():
        if name == "d2t":
            tensors[name] = value.to("cpu", torch.int64).contiguous()
            continue
        if name.startswith("layers.0."):
            name = "midlayer." + name[len("layers.0."):]
        tensors[name] = value.detach().to("cpu", torch.bfloat16).contiguous()
    t2d = torch.zeros(c.vocab_size, dtype=torch.bool)
    t2d[chosen] = True
    tensors["t2d"] = t2d
    config = {
        "architectures": ["LlamaForCausalLMEagle3"],
        "model_type": "llama",
        "hidden_size": c.hidden_size,
        "intermediate_size": c.intermediate_size,
        "num_attention_heads": c.num_heads,
        "num_key_value_heads": c.num_kv_heads,
        "head_dim": c.head_dim,
        "num_hidden_layers": 1,
        "rms_norm_eps": c.rms_norm_eps,
        "max_position_embeddings": tcfg.get("max_position_embeddings", 8192),
        "vocab_size": c.vocab_size,
        "draft_vocab_size": c.draft_vocab_size,
        "hidden_act": "silu",
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        "rope_theta": c.rope_theta,
        "rope_scaling": None,
        "bos_token_id": tcfg.get("bos_token_id"),
        "eos_token_id": tcfg.get("eos_token_id"),
        "eagle_config": {"eagle_aux_hidden_state_layer_ids": [i - 1 for i in AUX_IDS], "use_aux_hidden_state": True},
    }
    if c.fc_norm:
        config["fc_norm"] = True
    if c.norm_output:
        config["norm_output"] = True
    tmp = out_dir + ".tmp"
    os.makedirs(tmp, exist_ok=True)
    save_file(tensors, os.path.join(tmp, "model.safetensors"), metadata={"format": "pt"})
    with open(os.path.join(tmp, "config.json"), "w", encoding="utf-8") as fh:
        json.dump(config, fh, indent=2)
        fh.write("\n")
    if os.path.exists(out_dir):
        import shutil

        shutil.rmtree(out_dir)
    os.replace(tmp, out_dir)
    size = os.path.getsize(os.path.join(out_dir, "model.safetensors")) / 1e6
    print(f"saved {out_dir} ({size:.1f} MB)")


def main(argv=None) -> None:
    args = parse_args(argv)
    print("command: " + " ".join(shlex.quote(a) for a in [sys.executable, *sys.argv]))
    began = time.time()
    torch.manual_seed(args.seed)
    np.random.seed(args.seed)
    target_dir = args.target or materialize_smollm2(os.path.join(REPO, ".cache", "smollm2"))
    target = load_target(target_dir, device=args.device, dtype="float32")
    data = build_data(args, target_dir, target)
    print(f"data: {len(data['offsets']) - 1} sequences, {len(data['tokens'])} positions "
          f"({time.time() - began:.0f} s so far)")
    chosen = draft_vocabulary(data["labels"], target.vocab_size, args.draft_vocab)
    for variant in args.variants.split(","):
        variant = variant.strip()
        if variant not in ("eagle3", "eagle3.1"):
            raise SystemExit(f"unknown variant {variant!r}")
        drafter = train(args, data, variant, target, chosen)
        name = "smollm2-135m-eagle3" if variant == "eagle3" else "smollm2-135m-eagle3.1"
        save_specforge(drafter, chosen, target_dir, os.path.join(args.out, name))
    print(f"done in {time.time() - began:.0f} s")


if __name__ == "__main__":
    main()
