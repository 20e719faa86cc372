#!/usr/bin/env bash
# The main job: installs what is missing, then runs the adaptive demo.
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/setup.sh >/dev/null
exec "${SPECSWAP_VENV:-.venv}/bin/specswap" demo "$@"
