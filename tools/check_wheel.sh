#!/usr/bin/env bash
# Checks a built wheel: its metadata pins torch; cpu: installs in a fresh venv
# and passes the test suite; cuda: installs (beside the build environment's
# CUDA torch, no second 5 GB copy) and imports, no GPU needed; npu: lists the
# ACL / NPU graph symbols the extension links and checks that torch_npu exports
# every one (nothing runs without CANN and Ascend hardware).
# Usage: tools/check_wheel.sh VARIANT WHEEL [BUILD_VENV]
set -euo pipefail
cd "$(dirname "$0")/.."
variant=${1:?usage: tools/check_wheel.sh cpu|cuda|npu WHEEL}
wheel=${2:?usage: tools/check_wheel.sh cpu|cuda|npu WHEEL}
echo "[check_wheel] requirements: $(unzip -p "$wheel" '*.dist-info/METADATA' | grep '^Requires-Dist: torch' | tr '\n' ' ')"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
unzip -q "$wheel" -d "$tmp/unpacked"
so=$(ls "$tmp"/unpacked/specswap/_C*.so)
case "$variant" in
  cuda)
    venv=${3:?the cuda check needs the build venv (with torch 2.14.1) as third argument}
    "$venv/bin/python" -m pip install -q --disable-pip-version-check --no-deps --target "$tmp/site" "$wheel"
    (cd "$tmp" && PYTHONPATH="$tmp/site" "$venv/bin/python" -c "import specswap, specswap._core as c; print('[check_wheel] imports:', specswap.__version__, 'backends', c._C.compiled_backends(), 'from', c._C.__file__)")
    echo "[check_wheel] CUDA graph symbols linked:"
    nm -DC --undefined-only "$so" | grep -E 'CUDAGraph|graph_pool_handle|getStreamFromPool' | sed 's/^ *U /  /' ;;
  cpu)
    venv=$tmp/venv
    python3 -m venv "$venv"
    # the wheel with its own test extra: every test dependency comes from the wheel's metadata
    "$venv/bin/python" -m pip install -q --disable-pip-version-check -c .ci/constraints.txt "$wheel[test]"
    (cd "$tmp" && "$venv/bin/python" -c "import specswap, specswap._core as c; print('[check_wheel] imports:', specswap.__version__, 'backends', c._C.compiled_backends())")
    (cd "$tmp" && cp -r "$OLDPWD/tests" "$OLDPWD/pyproject.toml" . && "$venv/bin/python" -m pytest -q -p no:cacheprovider tests) ;;
  npu)
    echo "[check_wheel] ACL / NPU graph symbols the extension links:"
    nm -DC --undefined-only "$so" | grep -E 'NPUGraph|graph_pool_handle|getNPUStreamFromPool' | sed 's/^ *U /  /'
    # without CANN the extension cannot load, but every torch_npu symbol it needs must be one torch_npu exports
    venv=${3:?the npu check needs the build venv (with torch_npu) as third argument}
    npu_lib=$("$venv/bin/python" -c "import importlib.util, pathlib; print(pathlib.Path(importlib.util.find_spec('torch_npu').origin).parent / 'lib' / 'libtorch_npu.so')")
    nm -D --defined-only "$npu_lib" | awk '{print $NF}' | sort -u >"$tmp/exported"
    nm -D --undefined-only "$so" | awk '{print $NF}' | grep -E 'c10_npu|at_npu' | sort -u >"$tmp/needed"
    missing=$(comm -23 "$tmp/needed" "$tmp/exported")
    if [ -n "$missing" ]; then
      echo "[check_wheel] torch_npu does not export:" >&2; echo "$missing" | c++filt >&2; exit 1
    fi
    echo "[check_wheel] all $(wc -l <"$tmp/needed") torch_npu symbols resolve in $npu_lib"
    ldd "$so" | grep -E 'torch_npu|ascend' || true ;;
esac
