#!/usr/bin/env bash
# Set up (venv, CPU torch when no GPU, project + app/dev/bench extras, Chromium for the browser
# tests) and run the whole test suite, then the benchmarks in smoke mode.
set -euo pipefail
cd "$(dirname "$0")/.."
EXTRAS=app,dev,bench bash scripts/setup.sh
if ! command -v chromium >/dev/null 2>&1 && [ ! -x /usr/bin/chromium ]; then
  if [ "$(id -u)" = "0" ]; then
    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null) \
      || echo "warning: could not install Chromium; browser tests will fail" >&2
  else
    echo "warning: Chromium missing and not root; install it with: sudo apt-get install -y chromium" >&2
  fi
fi
. .venv/bin/activate
python -m ruff check .
python -m pytest "$@"
for bench in benchmarks/bench_*.py; do
  [ -e "$bench" ] || continue
  echo "== smoke: $bench"
  python "$bench" --smoke
done
