#!/usr/bin/env bash
# Regenerate the bundled ready runs in sample_data/runs/ (the comparison a fresh install shows on first open):
# DBK-RBF, SVGP and PPGP on Puerto Rico 2023 (log10 download Mbps, metro / non-metro strata), one seeded
# random 8:1:1 split, 1 km grid. Deterministic on one thread; about 6 minutes on a 2-core CPU.
#   bash scripts/bundle_runs.sh            (inside .venv, from anywhere)
set -euo pipefail
cd "$(dirname "$0")/.."
export OMP_NUM_THREADS=1
for spec in "dbk-rbf:--set epochs=100" "svgp:" "ppgp:"; do
  model=${spec%%:*}
  extra=${spec#*:}
  out=sample_data/runs/puerto-rico-2023-$model
  rm -rf "$out"
  # shellcheck disable=SC2086
  python -m gpcore fit --data sample:puerto_rico --quarter 2023 --y download_mbps --transform log10 \
      --strata county_metro --model "$model" $extra --set recalibrate=none --cell-km 1 --seed 0 --out "$out"
done
du -sh sample_data/runs/*
