"""The GGUF `eaglekit upgrade --to gguf` writes, loaded and run by a real llama.cpp (b11434).

Needs the llama.cpp build of scripts/llamacpp-build.sh (.llama-cpp; or EAGLEKIT_LLAMA_CPP naming the
llama-speculative-simple binary). The target is the bundled SmolLM2-135M-Instruct Q4_1 GGUF, the draft the bundled
EAGLE-3 drafter; llama.cpp's own counters say how many drafted tokens the target accepted. A copy with d2t left as
offsets is the control: the same engine accepts nothing from it.
"""

from __future__ import annotations

import os
import re
import subprocess

import numpy as np
import pytest

pytest.importorskip("gguf")
pytest.importorskip("transformers")

from eaglekit.decode.prompts import bundled_prompts  # noqa: E402
from eaglekit.engines.llamacpp import speculative_binary  # noqa: E402
from eaglekit.io.gguf import GgufTensor, read_gguf, write_gguf  # noqa: E402
from eaglekit.upgrade import UpgradeOptions, upgrade  # noqa: E402
from tests.support import REPO  # noqa: E402

BINARY = speculative_binary()
DRAFTER = REPO / "examples" / "drafters" / "smollm2-135m-eagle3"
pytestmark = [pytest.mark.engine, pytest.mark.skipif(not os.access(BINARY, os.X_OK),
                                                     reason="no llama.cpp build (scripts/llamacpp-build.sh)")]


def counts(draft: str, target: str, prompts: list[str]) -> tuple[int, int]:
    """(drafted, accepted) summed over prompts, from llama-speculative-simple's own counters."""
    drafted = accepted = 0
    for text in prompts:
        run = subprocess.run([BINARY, "-m", target, "-md", draft, "--spec-type", "draft-eagle3", "--spec-draft-n-max",
                              "3", "-p", text, "-n", "48", "--temp", "0", "-t", "2"],
                             capture_output=True, text=True, timeout=300)
        assert run.returncode == 0, run.stderr[-2000:]
        log = run.stderr + run.stdout
        drafted += int(re.search(r"n_drafted\s*=\s*(\d+)", log).group(1))
        accepted += int(re.search(r"n_accept\s*=\s*(\d+)", log).group(1))
    return drafted, accepted


@pytest.fixture(scope="module")
def chat_prompts(smollm2_dir):  # noqa: F811
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(smollm2_dir)
    return [tokenizer.apply_chat_template([dict(m) for m in p.messages], tokenize=False, add_generation_prompt=True)
            for p in bundled_prompts().prompts[:3]]


def test_llama_cpp_drafts_with_the_converted_drafter(tmp_path, chat_prompts):
    from examples.smollm2 import gguf_path

    target = gguf_path()
    draft = str(tmp_path / "draft.gguf")
    upgrade(str(DRAFTER), draft, UpgradeOptions(target=target, to="gguf", fc_norm=False, norm_output=False))
    drafted, accepted = counts(draft, target, chat_prompts)
    # eaglekit's reference accepts about 0.32 of this drafter's tokens (k=3, float32 target); llama.cpp on Q4_1 ~0.3
    assert drafted > 100 and accepted / drafted > 0.15, (drafted, accepted)

    # the control: the same file with d2t as offsets (what safetensors drafts store) maps every draft token to the
    # wrong target id, and the same engine accepts (almost) nothing
    contents, arrays = read_gguf(draft, tensor_data=lambda n: True)
    broken = str(tmp_path / "offsets.gguf")
    offsets = arrays["d2t"] - np.arange(arrays["d2t"].size)
    tensors = []
    for name, shape in contents.tensors.items():
        kind = contents.tensor_types[name]
        data = offsets if name == "d2t" else arrays[name].view({"BF16": np.uint16}.get(kind, arrays[name].dtype))
        tensors.append(GgufTensor(name, shape, kind, lambda data=data, shape=shape: data.reshape(shape)))
    fields = [f for k, f in contents.fields.items() if k != "general.architecture"]
    write_gguf(broken, "eagle3", fields, tensors)
    bad_drafted, bad_accepted = counts(broken, target, chat_prompts)
    assert bad_accepted / bad_drafted < 0.05 < accepted / drafted - 0.1, (bad_drafted, bad_accepted)
