#!/usr/bin/env bash
# The test command: installs what is missing (tools/setup.sh), runs the C++
# tests (plain and ThreadSanitizer builds), then the Python test suite
# against the installed package, then its capability-dependent tests again
# as on a CPU without AVX-512 or native bf16. Extra arguments go to both
# pytest runs (the second one keeps only its `-m capability` tests).
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/setup.sh
bash tools/test_cpp.sh
VENV=${SPECSWAP_VENV:-.venv}
# a component the install must have (the native GGUF kernels, the weight packages) fails its tests when missing
# instead of skipping them (tests/components.py): a build that lost its kernels cannot pass
export SPECSWAP_TEST_REQUIRE_ALL=1
# converted weights go to this checkout's build folder (tests/conftest.py), never the user's ~/.cache/specswap
export SPECSWAP_TEST_CACHE_DIR=${SPECSWAP_TEST_CACHE_DIR:-build/test-cache}
# every test, the slow ones too (the full tier x bucket capture, ~10 s): a -m in "$@" comes later and wins
"$VENV/bin/python" -m pytest -q -p no:cacheprovider -m "slow or not slow" "$@"
# specswap's override plus torch's kernels and oneDNN held to AVX2: a path that forgets to ask
# cpu_capability() meets the very error an AVX2-only CPU raises ("bf16 path needs the cpu support ...").
echo "[test] capability-dependent tests again with SPECSWAP_CPU_CAPS=-avx512 (no AVX-512, no native bf16)"
status=0
SPECSWAP_CPU_CAPS=-avx512 ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 \
  "$VENV/bin/python" -m pytest -q -p no:cacheprovider "$@" -m "capability and not slow" || status=$?
[ "$status" -eq 5 ] && status=0  # the arguments selected no capability test
exit "$status"
