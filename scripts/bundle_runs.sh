#!/usr/bin/env bash
# Regenerate the bundled ready runs in sample_data/runs/ (the comparison a fresh install shows on first open):
# dbk-nn (the default model, the winner of docs/benchmarks/race.md), vecchia, DBK-RBF, SVGP and PPGP on Puerto
# Rico 2023 (log10 download Mbps, `tests` weights as the Data page sets them, metro / non-metro strata), one
# seeded random 8:1:1 split, 1 km grid; and the same models tested on spatial blocks (whole 10 km squares held
# out). dbk-nn and vecchia are fitted with their defaults and keep a grid in both parts (the Decide page's joint
# posterior needs one); the block runs of the others keep only their test predictions (all the Compare page
# needs). Deterministic on one thread; about 15 minutes for each part on a 2-core CPU (dbk-nn about 6 of them).
#   bash scripts/bundle_runs.sh                    (inside .venv, from anywhere) both parts, every model
#   bash scripts/bundle_runs.sh random             only puerto-rico-2023-<model>
#   bash scripts/bundle_runs.sh block              only puerto-rico-2023-<model>-block
#   bash scripts/bundle_runs.sh all dbk-nn,vecchia only these models
set -euo pipefail
cd "$(dirname "$0")/.."
export OMP_NUM_THREADS=1
part=${1:-all}
only=${2:-}
case "$part" in all|random|block) ;; *) echo "usage: bash scripts/bundle_runs.sh [all|random|block] [MODEL,...]" >&2; exit 2;; esac
specs=("dbk-nn:" "vecchia:" "dbk-rbf:--set epochs=100 --set recalibrate=none" "svgp:--set recalibrate=none"
       "ppgp:--set recalibrate=none")
for split in random block; do
  [ "$part" = all ] || [ "$part" = "$split" ] || continue
  for spec in "${specs[@]}"; do
    model=${spec%%:*}
    extra=${spec#*:}
    if [ -n "$only" ] && [[ ",$only," != *",$model,"* ]]; then continue; fi
    out=sample_data/runs/puerto-rico-2023-$model
    split_args=()
    if [ "$split" = block ]; then
      out=$out-block
      split_args=(--split block --block-km 10)
      case "$model" in dbk-nn|vecchia) ;; *) split_args+=(--grid none);; esac
    fi
    rm -rf "$out"
    # shellcheck disable=SC2086
    python -m gpcore fit --data sample:puerto_rico --quarter 2023 --y download_mbps --transform log10 --weight tests \
        --strata county_metro --model "$model" $extra --cell-km 1 --seed 0 "${split_args[@]}" --out "$out"
  done
done
du -sh sample_data/runs/*
