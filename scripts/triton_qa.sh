#!/usr/bin/env bash
# Runs Triton's own QA unit tests (qa/L0_*) unchanged against shardserve and,
# with --triton, against the real tritonserver 2.51 installed under
# .backends/python, and prints pass/fail per case and totals per server.
# A developer tool, not part of CI: it needs Triton's server repository
# (a checkout or a bare mirror; default the mirror below), which is read
# with `git archive` into a temporary directory and never copied into ours.
#
#   scripts/triton_qa.sh [--triton] [--suites http,grpc,shm,batcher]
#                        [--cases REGEX] [--source DIR] [--ref v2.51.0]
#                        [--workdir DIR] [--keep]
#   scripts/triton_qa.sh --list       # the selection, without running it
#
# The tests talk to localhost:8000/8001/8002, so those ports must be free.
# `scripts/triton_qa.py --help` describes every option.
set -euo pipefail
cd "$(dirname "$0")/.."

# The QA tests import requests and psutil, which the project's .venv does
# not have: a venv of its own under target/, seeing .venv's packages
# (tritonclient, numpy) through a .pth file, so .venv is left untouched.
VENV=target/triton-qa/venv
if [ ! -x "$VENV/bin/python" ] || ! "$VENV/bin/python" -c 'import requests, psutil' 2>/dev/null; then
    base=$(readlink -f .venv)
    "$base/bin/python" -m venv "$VENV"
    site=$("$base/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
    own=$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
    echo "$site" >"$own/shardserve_venv.pth"
    "$VENV/bin/pip" install -q requests psutil
fi
exec "$VENV/bin/python" scripts/triton_qa.py "$@"
