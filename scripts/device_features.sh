#!/usr/bin/env bash
# Issue 24's figures on a lent 16-core machine, as one bounded script:
# the response cache across shards (scripts/bench_response_cache_scaling.sh
# at 1 and 8 shards: cache off, 16 segments, 1 segment, always-miss), the
# rate limiter's overhead (scripts/bench_rate_limit.sh), and start-up to
# ready of `simple` and `mlp_onnx` with no warmup vs a warmup of 100
# executions. Loopback only; every step is bounded.
#
# BIN_DIR holds stripped shardserve and shardserve-bench, libhwloc.so.15,
# libudev.so.1 and libonnxruntime.so (for mlp_onnx). OUT_DIR gets the output.
# Usage: scripts/device_features.sh BIN_DIR OUT_DIR
set -uo pipefail
cd "$(dirname "$0")/.."
bin=$(realpath "$1"); out=$(realpath "$2")
export LD_LIBRARY_PATH=$bin${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export SHARDSERVE_ORT_LIB=$bin/libonnxruntime.so

{
  echo "== response cache, 1 shard (server core 0, generator core 1)"
  MAX_TRIALS=4 timeout 130 scripts/bench_response_cache_scaling.sh 1 1024 "$bin" 18200
  echo "== response cache, 8 shards (server cores 0-7, generator cores 8-15)"
  MAX_TRIALS=4 timeout 130 scripts/bench_response_cache_scaling.sh 8 1024 "$bin" 18300
  echo "== rate limiter overhead (server core 0, generator core 1)"
  BENCH=$bin/shardserve-bench timeout 90 scripts/bench_rate_limit.sh "$bin/shardserve" 3 3 0 1 18400
} 2>&1 | tee "$out/features.txt"

# Start-up to ready with and without a warmup of 100 executions.
work=$(mktemp -d)
warm_repo() { # name src dims dtype warm
  local repo=$work/$1; mkdir -p "$repo"; cp -r "$2" "$repo/"
  local cfg=$repo/$(basename "$2")/config.pbtxt
  if [ "$5" = 1 ]; then
    {
      echo 'model_warmup [ { name: "w100" batch_size: 1 count: 100'
      for input in $(grep -o 'name: "INPUT[0-9]"' "$cfg" | sed 's/name: //; s/"//g'); do
        echo "  inputs { key: \"$input\" value { data_type: $4 dims: [ $3 ] random_data: true } }"
      done
      echo '} ]'
    } >>"$cfg"
  fi
}
warm_repo simple_cold models/simple 16 TYPE_INT32 0
warm_repo simple_warm models/simple 16 TYPE_INT32 1
warm_repo onnx_cold models/mlp_onnx 256 TYPE_FP32 0
warm_repo onnx_warm models/mlp_onnx 256 TYPE_FP32 1
port=18500
for round in 1 2 3; do
  for r in simple_cold simple_warm onnx_cold onnx_warm; do
    port=$((port + 3))
    t0=$(date +%s.%N)
    taskset -c 0 "$bin/shardserve" --model-repository "$work/$r" --host 127.0.0.1 --cores 1 \
      --http-port $port --grpc-port $((port + 1)) --metrics-port $((port + 2)) >"$out/warm-$r.log" 2>&1 &
    pid=$!
    for _ in $(seq 1 600); do
      curl -sf "http://127.0.0.1:$port/v2/health/ready" >/dev/null 2>&1 && break
      sleep 0.01
    done
    t1=$(date +%s.%N)
    execs=$(curl -s "http://127.0.0.1:$port/v2/models/stats" | grep -o '"execution_count":[0-9]*' | head -1)
    echo "round $round $r: ready after $(awk "BEGIN{printf \"%.3f\", $t1 - $t0}") s ($execs)"
    kill -TERM $pid; wait $pid 2>/dev/null
  done
done 2>&1 | tee -a "$out/features.txt"
rm -rf "$work"
