#!/usr/bin/env bash
# One command for the day a GPU machine is lent: every `gpu` test (exactness on CUDA in bf16 and
# with a bitsandbytes 4-bit target, among them) and a short `specchat bench` on tiny models, one
# summary line per check, within 5 minutes (the script keeps its own budget; `timeout` backs it).
# No network and no packaged models are needed. Without CUDA it says so, skips the CUDA checks
# and runs the bench on the CPU instead.
#
#   bash scripts/gpu_check.sh            # PYTHON=/path/to/python chooses the interpreter
set -euo pipefail
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1
exec timeout --kill-after=10 320 "${PYTHON:-python3}" scripts/gpu_check.py "$@"
