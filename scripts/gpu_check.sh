#!/usr/bin/env bash
# Issue 22's device checks in one prepared run, for a session that is lent a GPU (docs/benchmarks/gpu.md):
#   1. the neighbour searches on the device (grid search) against the host's KD-tree, at 100k and 1M points;
#   2. `vecchia` fitted and predicting at 100k and 1M points on the device (then `dbk-nn`, if time is left);
#   3. the grid-search tests, whose CUDA cases join automatically there.
# Each step has its own time limit so that one slow step cannot use up the machine; results go to OUT
# (the device tool's $OUT): device.txt, steps.txt (each step's limit, exit code and time), gpu_neighbors.json,
# gpu_vecchia.json, gpu_dbknn.json and a log per step (tests.log: the pytest output).
#
#   bash scripts/gpu_check.sh "$OUT"            # at most 9 minutes (BUDGET_S=540), one H100 / H200
#   BUDGET_S=300 bash scripts/gpu_check.sh out  # a shorter run: skips the steps that no longer fit
#   SIZES=20000 BUDGET_S=200 bash scripts/gpu_check.sh out   # a dry run of the mechanics on any machine
set -uo pipefail
cd "$(dirname "$0")/.."
out=${1:-gpu-check}
mkdir -p "$out"
budget=${BUDGET_S:-540}
sizes=${SIZES:-100000,1000000}  # points of the searches and fits
start=$(date +%s)
left() { echo $((budget - ($(date +%s) - start))); }
step() {  # step NAME SECONDS CMD...: run CMD with a limit of min(SECONDS, what is left), logging to OUT/NAME.log
  local name=$1 want=$2
  shift 2
  local have
  have=$(left)
  if [ "$have" -lt 30 ]; then echo "== $name: skipped ($have s left)" | tee -a "$out/steps.txt"; return; fi
  [ "$want" -gt "$have" ] && want=$have
  echo "== $name (limit ${want} s)" | tee -a "$out/steps.txt"
  timeout "$want" "$@" >"$out/$name.log" 2>&1
  echo "   exit $? after $(( $(date +%s) - start )) s" | tee -a "$out/steps.txt"
}
{ nvidia-smi || true; python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.cuda.is_available(),
torch.cuda.get_device_name(0) if torch.cuda.is_available() else '-')"; git log -1 --format='commit %h %s'; } \
  >"$out/device.txt" 2>&1
step neighbors 120 python3 benchmarks/bench_gpu.py --vecchia-only --neighbors "$sizes" \
  --json "$out/gpu_neighbors.json"
step tests 120 python3 -m pytest -q -p no:cacheprovider tests/gpcore/models/test_grid_search.py
step vecchia 300 python3 benchmarks/bench_gpu.py --vecchia-only --vecchia "$sizes" --vecchia-models vecchia \
  --vecchia-epochs 10 --vecchia-chunk 8192 --json "$out/gpu_vecchia.json"
step dbknn 300 python3 benchmarks/bench_gpu.py --vecchia-only --vecchia "$sizes" --vecchia-models dbk-nn \
  --vecchia-epochs 10 --vecchia-chunk 8192 --json "$out/gpu_dbknn.json"
tail -n 1 "$out/tests.log" 2>/dev/null
