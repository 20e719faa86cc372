#!/usr/bin/env bash
# The main job: installs what is missing (tools/setup.sh, Gemma weights included), then runs the default
# phased benchmark on Gemma 3 270M: baseline, static 1/3/7 and adaptive side by side on the
# low/high/low/high transition workload, with the per-phase oracle; adaptive runs the cost-aware goodput
# policy with the positional acceptance model (configs/goodput.json, docs/policy.md) (README.md gives its measured time).
# Results: runs/bench.json and runs/bench.png; the CPU capability line (specswap.capability: AVX-512, native
# bf16, which decide the "auto" dtype) is printed first and recorded as "cpu". Extra arguments go to `specswap bench`.
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/setup.sh >/dev/null
mkdir -p runs
exec "${SPECSWAP_VENV:-.venv}/bin/specswap" bench --speculative-algorithm NGRAM --threads 1 \
  --speculative-adaptive-config configs/goodput.json --output runs/bench.json --plot runs/bench.png "$@"
