#!/usr/bin/env bash
# Start-up time (process start to /v2/health/ready = 200) of a repository
# of many models: shardserve with 1, 2 and 4 load threads
# (--model-load-thread-count), and real tritonserver 2.51 on the same
# repository in the same run. The Triton in this checkout carries only the
# Python backend, so the comparison repository is Python-only; shardserve
# is also timed on the mixed one (Python + ONNX).
#
#   scripts/bench_startup.sh [python-models=12] [onnx-models=6] [rounds=1]
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${1:-12}
ONNX=${2:-6}
ROUNDS=${3:-1}
SHARDSERVE=target/release/shardserve
TRITON=.backends/python/pytriton/tritonserver/bin/tritonserver
BACKENDS=$(readlink -f .backends)
[ -x "$SHARDSERVE" ] || { echo "build first: cargo build --release" >&2; exit 1; }

WORK=$(mktemp -d /tmp/bench_startup.XXXXXX)
trap 'rm -rf "$WORK"' EXIT
mkdir -p "$WORK/py" "$WORK/mixed"
for i in $(seq 1 "$PY"); do
  for repo in py mixed; do
    cp -r models_python/py_simple "$WORK/$repo/py_simple_$i"
    sed -i "s/^name: \"py_simple\"/name: \"py_simple_$i\"/" "$WORK/$repo/py_simple_$i/config.pbtxt"
  done
done
for i in $(seq 1 "$ONNX"); do
  cp -r models/simple_onnx "$WORK/mixed/simple_onnx_$i"
  sed -i "s/^name: \"simple_onnx\"/name: \"simple_onnx_$i\"/" "$WORK/mixed/simple_onnx_$i/config.pbtxt"
done

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

# Runs "$@" (a server listening on HTTP port $HTTP), prints seconds to ready.
time_to_ready() {
  local log=$WORK/server.log start end pid
  start=$(date +%s.%N)
  "$@" >"$log" 2>&1 &
  pid=$!
  for _ in $(seq 1 6000); do
    if curl -sf -o /dev/null "http://127.0.0.1:$HTTP/v2/health/ready"; then break; fi
    if ! kill -0 "$pid" 2>/dev/null; then echo "server exited; log:" >&2; tail -20 "$log" >&2; return 1; fi
    sleep 0.02
  done
  end=$(date +%s.%N)
  kill -TERM "$pid"; wait "$pid" 2>/dev/null || true
  python3 -c "print(f'{$end - $start:.2f}')"
}

shardserve() { # repo threads
  HTTP=$(free_port)
  time_to_ready "$SHARDSERVE" --model-repository "$1" --backend-directory "$BACKENDS" \
    --http-port "$HTTP" --grpc-port 0 --metrics-port 0 --model-load-thread-count "$2"
}
triton() { # repo
  HTTP=$(free_port); GRPC=$(free_port); METRICS=$(free_port)
  time_to_ready "$TRITON" --model-repository "$1" --backend-directory "$BACKENDS" \
    --http-port "$HTTP" --grpc-port "$GRPC" --metrics-port "$METRICS"
}

echo "repository: $PY Python models (py) / + $ONNX ONNX models (mixed); seconds to ready"
for round in $(seq 1 "$ROUNDS"); do
  for t in 1 2 4; do echo "round $round  shardserve py    threads=$t  $(shardserve "$WORK/py" "$t")"; done
  echo "round $round  tritonserver py (2.51)     $(triton "$WORK/py")"
  for t in 1 2 4; do echo "round $round  shardserve mixed threads=$t  $(shardserve "$WORK/mixed" "$t")"; done
done
