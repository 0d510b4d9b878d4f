#!/usr/bin/env bash
# Create .venv and install the project with the extras in $EXTRAS (default app,dev,bench:
# the dashboard, the test tools and the benchmark peer; EXTRAS= installs the library alone).
# Installs the CPU build of torch first when no CUDA GPU is present, so that the
# `torch>=2.3` range in pyproject.toml does not pull a multi-GB CUDA build.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
. .venv/bin/activate
python -m pip install --quiet --upgrade pip
if ! python -c "import torch" >/dev/null 2>&1; then
  if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi >/dev/null 2>&1; then
    python -m pip install --quiet "torch>=2.3"
  else
    python -m pip install --quiet "torch==2.13.0" \
      || python -m pip install --quiet "torch>=2.3" --index-url https://download.pytorch.org/whl/cpu
  fi
fi
EXTRAS=${EXTRAS-app,dev,bench}
if [ -n "$EXTRAS" ]; then
  python -m pip install --quiet -e ".[$EXTRAS]"
else
  python -m pip install --quiet -e .
fi
