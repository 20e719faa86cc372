#!/usr/bin/env bash
# The test command: installs what is missing (tools/setup.sh), runs the C++
# tests (plain and ThreadSanitizer builds), then the Python test suite
# against the installed package. Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/setup.sh
bash tools/test_cpp.sh
VENV=${SPECSWAP_VENV:-.venv}
exec "$VENV/bin/python" -m pytest -q -p no:cacheprovider "$@"
