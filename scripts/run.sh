#!/usr/bin/env bash
# Sets up what is missing, then runs the server on the example repositories
# (models/, and models_python/ for Triton's Python backend).
# Extra arguments go to shardserve (e.g. --cores 2 --http-port 8000).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
exec target/release/shardserve --model-repository models --model-repository models_python "$@"
