#!/usr/bin/env bash
# Optional: the OpenVINO GenAI peer of bench/bench_llamacpp.py (--openvino-venv, --openvino-ir). Creates a venv
# of its own (.venv-openvino; never specswap's: optimum-intel 2.2.0 needs transformers 5.0.0) and exports the
# registry's Gemma 3 270M GGUF once to OpenVINO IR under build/openvino/ (tools/export_openvino.py). Not part of
# tools/setup.sh or CI. Needs specswap's .venv (the GGUF's path and specswap's converted tokenizer.json).
#   tools/setup_openvino.sh            # install, then export int4 (and int8 with OPENVINO_FORMATS="int4 int8")
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${OPENVINO_VENV:-.venv-openvino}
SPECSWAP_PY=${SPECSWAP_PYTHON:-.venv/bin/python}
[ -x "$VENV/bin/python" ] || python3 -m venv "$VENV"
PIP=("$VENV/bin/python" -m pip install --disable-pip-version-check)
echo "[openvino] torch 2.13.0 (CPU: the export traces the model with it), then OpenVINO 2026.4.1 and its exporters"
"${PIP[@]}" torch==2.13.0
"${PIP[@]}" openvino==2026.4.1 openvino-genai==2026.4.1.0 openvino-tokenizers==2026.4.1.0 optimum-intel==2.2.0 \
  nncf==3.4.0 transformers==5.0.0 accelerate gguf torch==2.13.0
# a torchvision pulled in beside torch 2.13.0 breaks its import ("torchvision::nms does not exist"); not needed
"$VENV/bin/python" -m pip uninstall -y -q torchvision 2>/dev/null || true
"$VENV/bin/python" -c "import openvino, openvino_genai; print('[openvino] openvino', openvino.__version__, 'genai', openvino_genai.__version__)"
"$SPECSWAP_PY" tools/export_openvino.py --openvino-venv "$VENV" --formats ${OPENVINO_FORMATS:-int4}
