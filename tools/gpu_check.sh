#!/usr/bin/env bash
# One prepared run for a lent GPU machine (device tool): build the CUDA
# variant in place, run the CUDA graph tests, then the engine benchmark with
# graphs on and off. Writes logs to ${OUT:-/tmp/specswap-gpu}.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-/tmp/specswap-gpu}
mkdir -p "$out"
export PYTHONUNBUFFERED=1 TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-9.0}
python3 -m pip install -q scikit-build-core ninja "cmake>=3.31" 2>&1 | tail -2
python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.cuda.is_available(), torch.cuda.get_device_name(0))" | tee "$out/env.txt"
bash tools/build_inplace.sh -DSPECSWAP_WITH_CUDA=ON 2>&1 | tail -3 | tee "$out/build.txt"
PYTHONPATH=python python3 -m pytest -q tests/graphs tests/core 2>&1 | tee "$out/tests.txt" | tail -5
PYTHONPATH=python python3 bench/bench_graphs.py --device cuda 2>&1 | tee "$out/bench_graphs.txt" | tail -20
