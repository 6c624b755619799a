#!/usr/bin/env bash
# The checks only a lent GPU machine (16 cores, one H100/H200) can run, as
# one bounded script: GPU discovery and placement, NVML metrics, pinned vs
# pageable copy bandwidth, CUDA shared memory end to end (cupy, that
# machine's own Python), then `simple` scaling at 1, 2, 4, 8 and 16 shards
# over HTTP and gRPC with the load generator on cores 8-15 (at 16 shards it
# shares them: said in the output). Loopback only; every step is bounded.
#
# BIN_DIR holds stripped x86-64 builds of shardserve, shardserve-bench and
# the pinned_bandwidth example, plus the shared libraries they need that such
# a machine lacks (libhwloc.so.15, libudev.so.1); OUT_DIR receives the
# results. Usage: scripts/device_check.sh BIN_DIR OUT_DIR [WINDOW_MS=2000]
set -uo pipefail
cd "$(dirname "$0")/.."
bin=$(realpath "$1"); out=$(realpath "$2"); window=${3:-2000}
export LD_LIBRARY_PATH=$bin${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
repo=$(mktemp -d); cp -r models/simple "$repo/"
pid=
trap '[ -n "$pid" ] && kill "$pid" 2>/dev/null; rm -rf "$repo"' EXIT

ready() {
  for _ in $(seq 1 300); do
    curl -sf "http://127.0.0.1:$1/v2/health/ready" >/dev/null 2>&1 && return 0
    sleep 0.1
  done
  echo "server on $1 never became ready"; return 1
}
stop() { kill -TERM "$pid" 2>/dev/null; wait "$pid" 2>/dev/null; pid=; }

{ nproc; uname -r; nvidia-smi -L; } 2>&1 | tee "$out/machine.txt"
timeout 60 "$bin/shardserve" topology >"$out/topology.txt" 2>&1
timeout 120 "$bin/pinned_bandwidth" >"$out/pinned.txt" 2>&1; echo "pinned_bandwidth rc=$?" >>"$out/pinned.txt"

# GPU-facing server checks with every core.
"$bin/shardserve" --model-repository "$repo" --host 127.0.0.1 >"$out/server-gpu.log" 2>&1 &
pid=$!
if ready 8000; then
  curl -s http://127.0.0.1:8002/metrics | grep -E '^nv_(gpu|pinned|cpu)' >"$out/gpu-metrics.txt"
  curl -s http://127.0.0.1:8000/v2 >>"$out/gpu-metrics.txt"
  timeout 120 python3 scripts/device_cuda_shm.py 127.0.0.1:8000 >"$out/cuda-shm.txt" 2>&1
  echo "device_cuda_shm rc=$?" >>"$out/cuda-shm.txt"
fi
stop

port=9000
for n in 1 2 4 8 16; do
  port=$((port + 10))
  taskset -c 0-$((n - 1)) "$bin/shardserve" --model-repository "$repo" --host 127.0.0.1 \
    --http-port $port --grpc-port $((port + 1)) --metrics-port $((port + 2)) --cores $n \
    >"$out/server-$n.log" 2>&1 &
  pid=$!
  ready $port || { stop; continue; }
  note=""; [ $n -gt 8 ] && note=" (generator shares cores 8-15 with the server)"
  conc=256; [ $n -eq 1 ] && conc=1,256
  for proto in http grpc; do
    p=$port; [ $proto = grpc ] && p=$((port + 1))
    echo "== shards=$n $proto$note"
    timeout 150 "$bin/shardserve-bench" -m simple -u 127.0.0.1:$p -i $proto \
      --concurrency-range $conc --cpu 8-15 --connections 4 -p "$window" --max-trials 5 \
      --no-progress -f "$out/scale-$proto-$n.csv" 2>&1 | tail -n 8
  done
  stop
done 2>&1 | tee "$out/scaling.txt"
