#!/usr/bin/env bash
# Set up (venv, CPU torch when no GPU, the project with its app extra) and start the dashboard on the bundled
# sample data at http://127.0.0.1:8501 . Extra arguments go to `streamlit run`.
set -euo pipefail
cd "$(dirname "$0")/.."
EXTRAS=app bash scripts/setup.sh
. .venv/bin/activate
# The safe server settings are passed explicitly too (later arguments override them).
exec streamlit run app/main.py --server.address 127.0.0.1 --server.enableXsrfProtection true \
    --server.maxUploadSize 200 --client.showErrorDetails type "$@"
