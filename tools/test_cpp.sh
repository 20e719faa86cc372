#!/usr/bin/env bash
# Builds and runs the C++ tests twice: a plain Release build and a
# ThreadSanitizer build (the stress test with 1,000,000 switches under both).
# Needs only cmake and a C++20 compiler (no torch, no Python).
set -euo pipefail
cd "$(dirname "$0")/.."
for sanitizer in none thread; do
  dir=build/cpp-tests-$sanitizer
  flag=""
  [ "$sanitizer" = none ] || flag="-DSPECSWAP_SANITIZER=$sanitizer"
  cmake -S . -B "$dir" -DSPECSWAP_BUILD_PYTHON=OFF -DSPECSWAP_BUILD_TESTS=ON $flag >/dev/null
  cmake --build "$dir" -j 2 >/dev/null
  echo "== C++ tests (sanitizer: $sanitizer)"
  log="$dir/ctest.log"
  rc=0
  TSAN_OPTIONS="halt_on_error=1" ctest --test-dir "$dir" --output-on-failure -V >"$log" 2>&1 || rc=$?
  grep -E "switches=|tests passed|tests failed|WARNING: ThreadSanitizer" "$log" || true
  if [ "$rc" != 0 ]; then cat "$log"; exit "$rc"; fi
done
