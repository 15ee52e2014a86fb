#!/usr/bin/env bash
# GPU check of the worker's vllm engine (bench/gpu_check_vllm.py) on a machine with a CUDA GPU, PyTorch and no network.
# When vllm is not installed, WHEELS names a folder holding vllm's wheel and those of the dependencies the machine lacks
# (made elsewhere with `pip download vllm==VERSION -d WHEELS` for the same platform and Python). Needs nothing else: the
# check builds its own tiny checkpoint. Exit status 1 when a check fails.
#
#   WHEELS=/path/to/wheels bash bench/gpu_check_vllm.sh [--requests 64]
set -euo pipefail
cd "$(dirname "$0")/.."
if ! python3 -c "import vllm" 2>/dev/null; then
  python3 -m pip install -q --no-index --find-links "${WHEELS:?vllm is not installed: set WHEELS to a folder of wheels}" vllm
fi
export PYTHONPATH="$PWD/libs:$PWD/services/worker${PYTHONPATH:+:$PYTHONPATH}"
exec python3 bench/gpu_check_vllm.py "$@"
