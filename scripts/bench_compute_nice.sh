#!/usr/bin/env bash
# `[compute] nice` on one shared core: the compute worker's nice value vs
# unbatched mlp_onnx throughput and /v2/health/live latency on the same
# core. Server on SERVER_CPU with one shard (reactor and compute worker
# share that CPU), generators on CLIENT_CPU. The values in NICES run
# alternately for ROUNDS rounds, so drift in the machine's load hits each
# alike. Loopback only, bounded in time.
#
# Usage: scripts/bench_compute_nice.sh [BINARY=target/release/shardserve] [SECONDS=5] [SERVER_CPU=0] [CLIENT_CPU=1] [PORT=18000]
#   env NICES="0 10" ROUNDS=2
set -euo pipefail
cd "$(dirname "$0")/.."
bin=${1:-target/release/shardserve}
secs=${2:-5}
server_cpu=${3:-0}
client_cpu=${4:-1}
port=${5:-18000}
nices=${NICES:-"0 10"}
rounds=${ROUNDS:-2}
bench=target/release/shardserve-bench
out=$(mktemp -d)
pid=
trap '[ -n "$pid" ] && kill "$pid" 2>/dev/null; rm -rf "$out"' EXIT

start() { # profile; each start takes the next three ports (TIME_WAIT)
  port=$((port + 3))
  taskset -c "$server_cpu" "$bin" --model-repository models --host 127.0.0.1 \
    --http-port "$port" --grpc-port $((port + 1)) --metrics-port $((port + 2)) \
    --cores 1 --tuning-profile "$1" >"$out/server.log" 2>&1 &
  pid=$!
  for _ in $(seq 1 200); do
    curl -sf "http://127.0.0.1:$port/v2/health/ready" >/dev/null 2>&1 && return 0
    sleep 0.1
  done
  echo "server did not become ready:"; cat "$out/server.log"; exit 1
}
stop() { kill -TERM "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; pid=; }
tput() { python3 -c "import json,sys; s=json.load(open(sys.argv[1]))['steps'][-1]; print(f\"{s['throughput']:.0f}/s p50={s['latency_us']['p50']:.0f}us p99={s['latency_us']['p99']:.0f}us\")" "$1"; }

for r in $(seq 1 "$rounds"); do
  for n in $nices; do
    printf 'name = "nice%s"\n[onnxruntime]\nintra_op_threads = 1\n[compute]\nnice = %s\n' "$n" "$n" >"$out/p$n.toml"
    start "$out/p$n.toml"
    for c in 1 16; do
      taskset -c "$client_cpu" "$bench" -m mlp_onnx -u 127.0.0.1:$port --concurrency-range $c \
        -p $((secs * 1000)) --max-trials 1 --cpu "$client_cpu" --json "$out/m.json" >/dev/null 2>&1 || true
      echo "round $r nice=$n mlp_onnx c=$c: $(tput "$out/m.json")"
    done
    taskset -c "$client_cpu" "$bench" -m mlp_onnx -u 127.0.0.1:$port --concurrency-range 64 \
      -p $((secs * 1000)) --max-trials 1 --cpu "$client_cpu" --json "$out/m.json" >/dev/null 2>&1 &
    load=$!
    sleep 1.5
    taskset -c "$client_cpu" wrk -t1 -c1 -d$((secs - 2))s --latency \
      "http://127.0.0.1:$port/v2/health/live" >"$out/h.txt"
    wait $load || true
    echo "round $r nice=$n mlp_onnx c=64: $(tput "$out/m.json"); health/live meanwhile p50=$(awk '/ 50%/ {print $2}' "$out/h.txt") p99=$(awk '/ 99%/ {print $2}' "$out/h.txt")"
    stop
  done
done
