#!/usr/bin/env bash
# Checks a built wheel: its metadata pins torch; cpu: installs in a fresh venv
# and passes the test suite; cuda: installs and imports (no GPU needed to
# import); npu: lists the ACL / NPU graph symbols the extension links (nothing
# runs without CANN and Ascend hardware).
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
  cpu|cuda)
    venv=$tmp/venv
    python3 -m venv "$venv"
    "$venv/bin/python" -m pip install -q --disable-pip-version-check -c .ci/constraints.txt "$wheel"
    (cd "$tmp" && "$venv/bin/python" -c "import specswap, specswap._core as c; print('[check_wheel] imports:', specswap.__version__, 'backends', c._C.compiled_backends())")
    if [ "$variant" = cpu ]; then
      "$venv/bin/python" -m pip install -q --disable-pip-version-check -c .ci/constraints.txt pytest hypothesis transformers google-benchmark
      (cd "$tmp" && cp -r "$OLDPWD/tests" . && "$venv/bin/python" -m pytest -q -p no:cacheprovider tests)
    else
      echo "[check_wheel] CUDA symbols linked: $(nm -D --undefined-only "$so" | grep -c -E 'CUDAGraph|cuda') "
    fi ;;
  npu)
    echo "[check_wheel] ACL / NPU graph symbols the extension links:"
    nm -DC --undefined-only "$so" | grep -E 'NPUGraph|graph_task|graph_pool_handle|getNPUStreamFromPool' | sed 's/^ *U /  /'
    ldd "$so" | grep -E 'torch_npu|ascend' || true ;;
esac
