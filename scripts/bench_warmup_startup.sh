#!/usr/bin/env bash
# Start-up time (process start to /v2/health/ready = 200) of one model
# without warmup and with a warmup of 100 executions (one sample,
# batch_size 1, count 100): mlp_onnx (ONNX Runtime) and simple (built-in)
# on shardserve; py_simple (Python backend) on shardserve and on real
# tritonserver 2.51 in the same run. The server is pinned to core 0.
#
#   scripts/bench_warmup_startup.sh [rounds=3]
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=${1:-3}
SHARDSERVE=target/release/shardserve
TRITON=.backends/python/pytriton/tritonserver/bin/tritonserver
BACKENDS=$(readlink -f .backends)
[ -x "$SHARDSERVE" ] || { echo "build first: cargo build --release" >&2; exit 1; }

WORK=$(mktemp -d /tmp/bench_warmup.XXXXXX)
trap 'rm -rf "$WORK"' EXIT

# repo name model dims dtype with_warmup
make_repo() {
  local repo=$WORK/$1 src=$2 input_dims=$3 dtype=$4 warm=$5
  mkdir -p "$repo"
  cp -r "$src" "$repo/"
  local cfg=$repo/$(basename "$src")/config.pbtxt
  if [ "$warm" = 1 ]; then
    {
      echo 'model_warmup [ { name: "w100" batch_size: 1 count: 100'
      for input in $(grep -o 'name: "INPUT[0-9]"' "$cfg" | sed 's/name: //; s/"//g'); do
        echo "  inputs { key: \"$input\" value { data_type: $dtype dims: [ $input_dims ] random_data: true } }"
      done
      echo '} ]'
    } >>"$cfg"
  fi
}
make_repo onnx_cold models/mlp_onnx 256 TYPE_FP32 0
make_repo onnx_warm models/mlp_onnx 256 TYPE_FP32 1
make_repo simple_cold models/simple 16 TYPE_INT32 0
make_repo simple_warm models/simple 16 TYPE_INT32 1
make_repo py_cold models_python/py_simple 16 TYPE_INT32 0
make_repo py_warm models_python/py_simple 16 TYPE_INT32 1

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

time_to_ready() {
  local log=$WORK/server.log start end pid
  start=$(date +%s.%N)
  taskset -c 0 "$@" >"$log" 2>&1 &
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
shardserve() {
  HTTP=$(free_port)
  time_to_ready "$SHARDSERVE" --model-repository "$WORK/$1" --backend-directory "$BACKENDS" \
    --http-port "$HTTP" --grpc-port 0 --metrics-port 0 --cores 1
}
triton() {
  HTTP=$(free_port); GRPC=$(free_port); METRICS=$(free_port)
  time_to_ready "$TRITON" --model-repository "$WORK/$1" --backend-directory "$BACKENDS" \
    --http-port "$HTTP" --grpc-port "$GRPC" --metrics-port "$METRICS"
}

printf '%-34s %s\n' "server / model" "seconds to ready, per round"
for case in onnx simple py; do
  for warm in cold warm; do
    line=""
    for _ in $(seq 1 "$ROUNDS"); do line="$line $(shardserve "${case}_$warm")"; done
    printf '%-34s%s\n' "shardserve $case $warm" "$line"
  done
done
if [ -x "$TRITON" ]; then
  for warm in cold warm; do
    line=""
    for _ in $(seq 1 "$ROUNDS"); do line="$line $(triton "py_$warm")"; done
    printf '%-34s%s\n' "tritonserver py_simple $warm" "$line"
  done
fi
