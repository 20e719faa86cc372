#!/usr/bin/env bash
# Builds specswap._C for a source checkout and drops it into python/specswap/,
# so `PYTHONPATH=python` works without reinstalling. Uses the active Python
# ($PYTHON); extra arguments go to CMake. SPECSWAP_BUILD_DIR (default
# build/inplace) keeps a variant's CMake cache apart from the default build's.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python}
build=${SPECSWAP_BUILD_DIR:-build/inplace}
cmake -S . -B "$build" -G Ninja -DPython3_EXECUTABLE="$(command -v "$PYTHON")" "$@" >/dev/null
cmake --build "$build"
for so in "$build"/_C*.so; do
  # copied beside, then renamed into place: a process that loaded the old library keeps its (unlinked) file
  # instead of crashing on one rewritten under it
  cp "$so" "python/specswap/.$(basename "$so").tmp"
  mv -f "python/specswap/.$(basename "$so").tmp" "python/specswap/$(basename "$so")"
done
echo "built $(ls python/specswap/_C*.so)"
