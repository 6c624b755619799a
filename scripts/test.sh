#!/usr/bin/env bash
# Sets up what is missing, then runs the whole test suite: Rust unit and
# integration tests, then the tritonclient compatibility suite (Python)
# against the release binary.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
echo "== cargo test"
cargo test --release --all-targets
echo "== tritonclient compatibility suite"
.venv/bin/python -m pytest -q tests/python
