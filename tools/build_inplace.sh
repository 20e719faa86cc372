#!/usr/bin/env bash
# Builds specswap._C for a source checkout and drops it into python/specswap/,
# so `PYTHONPATH=python` works without reinstalling. Uses the active Python.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python}
cmake -S . -B build/inplace -G Ninja -DPython3_EXECUTABLE="$(command -v "$PYTHON")" "$@" >/dev/null
cmake --build build/inplace
cp build/inplace/_C*.so python/specswap/
echo "built $(ls python/specswap/_C*.so)"
