#!/usr/bin/env bash
# Regenerate the bundled ready runs in sample_data/runs/ (the comparison a fresh install shows on first open):
# DBK-RBF, SVGP and PPGP on Puerto Rico 2023 (log10 download Mbps, metro / non-metro strata), one seeded
# random 8:1:1 split, 1 km grid; and the same three models tested on spatial blocks (whole 10 km squares held
# out, no grid: the Compare page needs only their test predictions). Deterministic on one thread; about
# 6 minutes for each part on a 2-core CPU.
#   bash scripts/bundle_runs.sh            (inside .venv, from anywhere) both parts
#   bash scripts/bundle_runs.sh random     only puerto-rico-2023-<model>
#   bash scripts/bundle_runs.sh block      only puerto-rico-2023-<model>-block
set -euo pipefail
cd "$(dirname "$0")/.."
export OMP_NUM_THREADS=1
part=${1:-all}
case "$part" in all|random|block) ;; *) echo "usage: bash scripts/bundle_runs.sh [all|random|block]" >&2; exit 2;; esac
if [ "$part" != block ]; then
for spec in "dbk-rbf:--set epochs=100" "svgp:" "ppgp:"; do
  model=${spec%%:*}
  extra=${spec#*:}
  out=sample_data/runs/puerto-rico-2023-$model
  rm -rf "$out"
  # shellcheck disable=SC2086
  python -m gpcore fit --data sample:puerto_rico --quarter 2023 --y download_mbps --transform log10 \
      --strata county_metro --model "$model" $extra --set recalibrate=none --cell-km 1 --seed 0 --out "$out"
done
fi
if [ "$part" != random ]; then
for spec in "dbk-rbf:--set epochs=100" "svgp:" "ppgp:"; do
  model=${spec%%:*}
  extra=${spec#*:}
  out=sample_data/runs/puerto-rico-2023-$model-block
  rm -rf "$out"
  # shellcheck disable=SC2086
  python -m gpcore fit --data sample:puerto_rico --quarter 2023 --y download_mbps --transform log10 \
      --strata county_metro --model "$model" $extra --set recalibrate=none --split block --block-km 10 \
      --grid none --seed 0 --out "$out"
done
fi
du -sh sample_data/runs/*
