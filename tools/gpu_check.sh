#!/usr/bin/env bash
# The GPU proof in one run, for a machine lent through the device tool, where nothing can be fetched:
# builds the CUDA variant in place against the torch already installed there, then tools/gpu_check.py runs
# every check (the graph tests on CUDA, the engine lossless in fp32, the sampling law, the memory each tier
# adds, decode rounds with graphs against eager on a Gemma-3-270M-shaped target) and writes ONE JSON report.
#
#   bash tools/gpu_check.sh [--out DIR] [--device cuda|cuda:N|cpu] [--skip-build] [--checks "graphs engine ..."]
#                           [--budget-s SECONDS] [--measure-args "..."] [--python PYTHON]
#
# Report: DIR/gpu_check.json (DIR: --out, else $OUT, else /tmp/specswap-gpu); every check's full output in
# DIR/gpu_check.log. Exit status 0 when every check passed, 1 when any failed, 2 on bad arguments. Wheels of
# packages the machine lacks travel in .whl/ (see the device tool's README) and are installed from there.
# The whole run is sized for 8 minutes on an H200: the checks get what the build leaves of --budget-s.
# SPECSWAP_COMMIT: the commit to record where the copy that runs has no .git.
set -euo pipefail
cd "$(dirname "$0")/.."

usage() {  # the comment block at the top of this file
  awk 'NR > 1 && !/^#/ { exit } NR > 1 { sub(/^# ?/, ""); print }' "$0"
}

invocation="bash tools/gpu_check.sh${*:+ $*}"
out=${OUT:-/tmp/specswap-gpu}
device=cuda
build=1
checks=""
budget_s=450
measure_args=""
python=${PYTHON:-python3}
while [ $# -gt 0 ]; do
  case "$1" in
    --out) out=${2:?--out needs a directory}; shift 2 ;;
    --device) device=${2:?--device needs a value: cuda, cuda:N or cpu}; shift 2 ;;
    --skip-build) build=0; shift ;;
    --checks) checks=${2:?--checks needs names: graphs engine sampling measure}; shift 2 ;;
    --budget-s) budget_s=${2:?--budget-s needs seconds}; shift 2 ;;
    --measure-args) measure_args=${2?--measure-args needs a string}; shift 2 ;;
    --python) python=${2:?--python needs an interpreter}; shift 2 ;;
    -h|--help) usage; exit 0 ;;
    *) echo "gpu_check.sh: unknown argument '$1'" >&2; usage >&2; exit 2 ;;
  esac
done
case "$device" in
  cpu|cuda|cuda:[0-9]*) ;;
  *) echo "gpu_check.sh: --device '$device' is not checked here; valid: cuda, cuda:N, cpu" >&2; exit 2 ;;
esac
case "$budget_s" in
  ''|*[!0-9]*) echo "gpu_check.sh: --budget-s must be a whole number of seconds; got '$budget_s'" >&2; exit 2 ;;
esac
command -v "$python" >/dev/null || { echo "gpu_check.sh: no Python interpreter '$python'" >&2; exit 2; }

mkdir -p "$out"
start=$(date +%s)
export PYTHONUNBUFFERED=1
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
build_log="$work/build.log"
: >"$build_log"

# A failing step below runs in a subshell with errexit of its own, and its status goes into the report (which
# then fails) instead of ending the script before the report is written.
build_rc=0
build_command=""
# packages the machine lacks, carried as wheels: installed into a private target, never over its own
if compgen -G ".whl/*.whl" >/dev/null; then
  echo "[gpu_check] installing $(ls .whl/*.whl | wc -l) carried wheels" | tee -a "$build_log"
  build_command="pip install --no-index --no-deps --target /tmp/specswap-site .whl/*.whl"
  set +e
  (set -e; "$python" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
     --target /tmp/specswap-site .whl/*.whl) >>"$build_log" 2>&1
  build_rc=$?
  set -e
  export PYTHONPATH="/tmp/specswap-site${PYTHONPATH:+:$PYTHONPATH}" PATH="/tmp/specswap-site/bin:$PATH"  # cmake, ninja
fi

build_args=()
if [ "$build" = 1 ] && [ "$build_rc" = 0 ]; then
  build_command="SPECSWAP_BUILD_DIR=build/gpu-check PYTHON=$python bash tools/build_inplace.sh -DSPECSWAP_WITH_CUDA=ON"
  build_one() {
    # torch's CUDA CMake config wants the toolkit's headers and libnvrtc; the nvidia-* wheels beside a
    # pip-installed torch carry those its image may lack (site-packages/nvidia/cu13)
    local nvidia
    nvidia=$("$python" -c "import os, nvidia; print(os.path.join(list(nvidia.__path__)[0], 'cu13'))" 2>/dev/null || true)
    local defines=(-DSPECSWAP_WITH_CUDA=ON)
    if [ -n "$nvidia" ] && [ -d "$nvidia/include" ]; then
      export CPATH="$nvidia/include${CPATH:+:$CPATH}"
      export LIBRARY_PATH="$nvidia/lib${LIBRARY_PATH:+:$LIBRARY_PATH}"
      local nvrtc
      nvrtc=$(ls "$nvidia"/lib/libnvrtc.so.* 2>/dev/null | head -1 || true)
      [ -z "$nvrtc" ] || defines+=(-DCUDA_nvrtc_LIBRARY="$nvrtc")
    fi
    # the toolkit's own nvcc: a wrapper elsewhere on PATH would point CMake at the wrong toolkit root
    local nvcc="${CUDA_HOME:-/usr/local/cuda}/bin/nvcc"
    [ -x "$nvcc" ] || nvcc=$(readlink -f "$(command -v nvcc)")
    local cuda_root
    cuda_root=$(dirname "$(dirname "$nvcc")")
    defines+=(-DCMAKE_CUDA_COMPILER="$nvcc" -DCUDAToolkit_ROOT="$cuda_root" -DCUDA_TOOLKIT_ROOT_DIR="$cuda_root")
    # the cmake and ninja installed beside this Python first (CMake older than 3.31 cannot drive nvcc 13 in
    # C++20 mode), then the toolkit's binaries, as torch's CUDA CMake config looks for them on PATH
    PATH="$(dirname "$(command -v "$python")"):$cuda_root/bin:$PATH"
    # a fixed arch list skips torch's GPU probe; 9.0 = Hopper (H100/H200)
    export TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-9.0} CUDA_HOME=${CUDA_HOME:-$cuda_root}
    "$python" -c "import torch; print('torch', torch.__version__, 'CUDA', torch.version.cuda)"
    # the extension needs the interpreter's headers: say so plainly if an image's Python came without them
    "$python" -c "import os, sysconfig; d = sysconfig.get_paths()['include']; print('Python.h', 'in' if os.path.isfile(os.path.join(d, 'Python.h')) else 'MISSING from', d)"
    cmake --version | head -1
    "$nvcc" --version | tail -1
    SPECSWAP_BUILD_DIR=build/gpu-check PYTHON="$python" bash tools/build_inplace.sh "${defines[@]}"
  }
  echo "[gpu_check] building the CUDA variant (log: $out/gpu_check.log)"
  build_start=$(date +%s)
  set +e
  (set -e; build_one) >>"$build_log" 2>&1
  build_rc=$?
  set -e
  build_seconds=$(( $(date +%s) - build_start ))
  tail -3 "$build_log"
  build_args=(--build-rc "$build_rc" --build-seconds "$build_seconds" --build-log "$build_log"
              --build-command "$build_command")
elif [ "$build_rc" != 0 ]; then  # the wheels did not install: that fails the run like a failed build
  build_args=(--build-rc "$build_rc" --build-seconds 0 --build-log "$build_log" --build-command "$build_command")
fi

elapsed=$(( $(date +%s) - start ))
left=$(( budget_s > elapsed + 10 ? budget_s - elapsed : 10 ))
# SPECSWAP_COMMIT names the commit where the copy that runs here has no .git
commit=${SPECSWAP_COMMIT:-$(git rev-parse HEAD 2>/dev/null || echo unknown)}
if [ -z "${SPECSWAP_COMMIT:-}" ] && [ "$commit" != unknown ] && ! git diff --quiet HEAD -- 2>/dev/null; then
  commit="$commit-dirty"
fi
check_args=()
if [ -n "$checks" ]; then
  read -r -a names <<<"$checks"
  check_args=(--checks "${names[@]}")
fi
rc=0
"$python" tools/gpu_check.py run --device "$device" --report "$out/gpu_check.json" --log "$work/checks.log" \
  --budget-s "$left" --commit "$commit" --command "$invocation" \
  "--measure-args=$measure_args" "${check_args[@]}" "${build_args[@]}" || rc=$?
cat "$build_log" "$work/checks.log" 2>/dev/null >"$out/gpu_check.log" || true
if [ ! -s "$out/gpu_check.json" ]; then
  echo "[gpu_check] no report was written (tools/gpu_check.py exit status $rc)" >&2
  exit $(( rc == 0 ? 1 : rc ))
fi
echo "[gpu_check] $(( $(date +%s) - start )) s in all; report $out/gpu_check.json"
exit "$rc"
