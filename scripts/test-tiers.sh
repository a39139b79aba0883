#!/usr/bin/env bash
# The test suite tier by tier, the fastest first; a failing tier stops the run before the longer ones start.
#   fast    pytest's defaults (pyproject.toml): what `pytest` with no arguments runs, the contributor's loop
#   triton  the Triton kernels, run by Triton's interpreter on CPU (TRITON_INTERPRET=1, tests/conftest.py)
#   model   the tests that load SmolLM2 or train
#   engine  the tests that run a real serving engine (vLLM's CPU build, llama.cpp)
# Extra arguments go to every tier's pytest (e.g. -x).
set -euo pipefail
cd "$(dirname "$0")/.."

tier() {
  local name=$1; shift
  local started=$SECONDS
  echo "== tier ${name}: python -m pytest -q -n 2${*:+ ${*@Q}}"
  python -m pytest -q -n 2 "$@"
  echo "== tier ${name} passed in $((SECONDS - started)) s"
}

tier fast "$@"
tier triton -m "triton and not model and not engine" "$@"
tier model -m "model and not engine" "$@"
tier engine -m "engine" "$@"
