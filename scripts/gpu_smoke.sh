#!/usr/bin/env bash
# The trainer on one CUDA GPU, driven directly (no Ray, no vLLM): FSDP2 in bf16 on a ~0.5B model built in
# code, trainer vs torch-engine logprobs, tokens/s, peak memory against fasync's estimate. Under 5 minutes.
# Needs only torch with CUDA and fasync's own dependencies. Results: stdout, and $OUT/gpu_smoke.md if OUT is set.
set -euo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
exec timeout 300 "${PYTHON:-python3}" scripts/gpu_smoke.py "$@"
