#!/usr/bin/env bash
# The interpreter for the GPU checks: $GPU_PY if set, else the first of .venv/bin/python and python3 that has every
# package the checks import and whose torch is a CUDA build that sees a device (scripts/gpu_env.py). Prints its path
# on stdout and, on stderr, which it took and what it found there; without one, one line on stderr saying what each
# candidate lacks (every missing package by its pip name), and status 1.
set -u
cd "$(dirname "$0")/.."
lacking=""
for py in ${GPU_PY:-.venv/bin/python python3}; do
    if ! command -v "$py" >/dev/null 2>&1; then
        lacking+="; $py: not found"
    elif found=$("$py" scripts/gpu_env.py 2>&1); then
        echo "GPU python: $py ($found)" >&2
        echo "$py"
        exit 0
    else
        lacking+="; $py: ${found##*$'\n'}"
    fi
done
echo "no python fit for the GPU checks here (${lacking#; }); set GPU_PY=/path/to/python" >&2
exit 1
