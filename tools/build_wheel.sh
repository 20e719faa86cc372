#!/usr/bin/env bash
# Builds a specswap wheel for one variant into dist/:
#   cpu   against torch 2.13.0 (CPU)           -> specswap-X+cpu-...whl
#   cuda  against torch 2.14.1 (CUDA 13.0)      -> specswap-X+cu130-...whl   (compiles and links here; runs on a GPU)
#   npu   against torch 2.13.0 + torch_npu 2.13.0 -> specswap-X+npu-...whl   (compiles and links here; runs with CANN)
# Each variant builds in its own virtual environment (.venv-build-VARIANT, or
# $SPECSWAP_BUILD_VENV), from a staged copy of the tracked sources whose
# version carries the variant and whose torch requirement is pinned to the
# torch it was built against. Then it checks the wheel (see tools/check_wheel.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
variant=${1:?usage: tools/build_wheel.sh cpu|cuda|npu}
root=$(pwd)
venv=${SPECSWAP_BUILD_VENV:-$root/.venv-build-$variant}
defines=()
case "$variant" in
  cpu)  packages=(torch==2.13.0); tag=cpu ;;
  cuda) packages=(torch==2.14.1); tag=cu130
        cuda_root=${CUDA_HOME:-/usr/local/cuda}
        defines=(-Ccmake.define.SPECSWAP_WITH_CUDA=ON -Ccmake.define.CUDA_TOOLKIT_ROOT_DIR="$cuda_root"
                 -Ccmake.define.CUDAToolkit_ROOT="$cuda_root" -Ccmake.define.CMAKE_CUDA_COMPILER="$cuda_root/bin/nvcc") ;;
  npu)  packages=(torch==2.13.0 torch_npu==2.13.0 pyyaml); tag=npu
        export TORCH_DEVICE_BACKEND_AUTOLOAD=0  # torch_npu cannot load without CANN here
        defines=(-Ccmake.define.SPECSWAP_WITH_NPU=ON) ;;
  *) echo "unknown variant '$variant'; valid: cpu, cuda, npu" >&2; exit 2 ;;
esac

[ -x "$venv/bin/python" ] || python3 -m venv "$venv"
echo "[build_wheel] $variant: build environment $venv (${packages[*]})"
"$venv/bin/python" -m pip install -q --disable-pip-version-check "${packages[@]}" scikit-build-core ninja numpy libggml-python==0.20.2.post1

if [ "$variant" = cuda ]; then
  # torch's CUDA cmake config wants headers (cusparse.h, ...) and libnvrtc that
  # the nvidia-* wheels install under site-packages/nvidia/cu13.
  nvidia=$("$venv/bin/python" -c "import nvidia, os; print(os.path.dirname(nvidia.__path__[0]) + '/nvidia/cu13')")
  export CPATH="$nvidia/include${CPATH:+:$CPATH}"
  export LIBRARY_PATH="$nvidia/lib${LIBRARY_PATH:+:$LIBRARY_PATH}"
  defines+=(-Ccmake.define.CUDA_nvrtc_LIBRARY="$(ls "$nvidia"/lib/libnvrtc.so.* | head -1)")
  export PATH="$cuda_root/bin:$PATH"
  # a fixed arch list skips torch's GPU probe (there is no GPU here); 9.0 = Hopper (H100/H200)
  export TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-9.0}
  # CMake 3.25 cannot drive nvcc 13 in C++20 mode; a newer CMake from PyPI can
  "$venv/bin/python" -m pip install -q --disable-pip-version-check "cmake>=3.31"
fi

torch_version=$("$venv/bin/python" -c "import torch; print(torch.__version__.split('+')[0])")
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
git ls-files -z | xargs -0 tar cf - | tar xf - -C "$stage"
base_version=$(sed -n 's/^version = "\(.*\)"/\1/p' pyproject.toml)
sed -i "s/^version = \".*\"/version = \"$base_version+$tag\"/; s/\"torch==[^\"]*\"/\"torch==$torch_version\"/g" "$stage/pyproject.toml"
if [ "$variant" = npu ]; then
  sed -i "s/^  \"torch==$torch_version\",/  \"torch==$torch_version\",\n  \"torch_npu==2.13.0\",/" "$stage/pyproject.toml"
fi
mkdir -p dist
echo "[build_wheel] $variant: compiling (this takes a few minutes)"
"$venv/bin/python" -m pip wheel -q --no-build-isolation --no-deps -w dist "${defines[@]}" \
  -Cbuild-dir="$root/build/wheel-$variant" "$stage"
wheel=$(ls -t dist/specswap-"$base_version+$tag"-*.whl | head -1)
echo "[build_wheel] built $wheel (torch==$torch_version)"
bash tools/check_wheel.sh "$variant" "$wheel" "$venv"
