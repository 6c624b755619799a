#!/usr/bin/env bash
# Execution-engine measurements on one machine, server and load generators
# pinned apart (server on SERVER_CPU with one shard, generators on
# CLIENT_CPU). Loopback only, bounded in time. Prints one line per figure.
#
#   1. /v2/health/live latency (wrk, 1 connection) while mlp_onnx runs at
#      concurrency 64 (shardserve-bench, HTTP binary tensors)
#   2. simple over HTTP JSON (wrk) at concurrency 1 and 64
#   3. mlp_onnx_dyna with 1, 2 and 4 instances at concurrency 64, with the
#      executed batch sizes from the statistics, and where the server's core
#      went: CPU seconds of the compute workers vs the shard (network) thread
#      during the run, and the inferences per compute-CPU-second (compare
#      with scripts/bench_ort_direct.py's batched figure: the compute side's
#      efficiency, apart from the network work sharing its core)
#
# Usage: scripts/bench_engine.sh [BINARY=target/release/shardserve] [SECONDS=8] [SERVER_CPU=0] [CLIENT_CPU=1]
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/lib.sh
source scripts/lib.sh
bin=${1:-target/release/shardserve}
secs=${2:-8}
server_cpu=${3:-0}
client_cpu=${4:-1}
bench=target/release/shardserve-bench
out=$(mktemp -d)
pid=
trap '[ -n "$pid" ] && kill "$pid" 2>/dev/null; rm -rf "$out"' EXIT
port=18000

start() { # repo
  taskset -c "$server_cpu" "$bin" --model-repository "$1" --host 127.0.0.1 \
    --http-port $port --grpc-port $((port + 1)) --metrics-port $((port + 2)) \
    --cores 1 >"$out/server.log" 2>&1 &
  pid=$!
  ss_wait_ready $port 200 || { echo "server did not become ready:"; cat "$out/server.log"; exit 1; }
}
cpu_ticks() { # pid -> "compute_ticks shard_ticks" (utime+stime of each thread class)
  ss_thread_counters "$1" | cut -d" " -f1,2
}
stop() { kill -TERM "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; pid=; }

summary() { # shardserve-bench --json file -> "infer/s=... p50=...us p99=...us"
  python3 - "$1" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))["steps"][-1]
print(f"infer/s={s['throughput']:.0f} p50={s['latency_us']['p50']:.0f}us p99={s['latency_us']['p99']:.0f}us")
PY
}

# 1. health probes while mlp_onnx runs at concurrency 64
start models
taskset -c "$client_cpu" "$bench" -m mlp_onnx -u 127.0.0.1:$port --concurrency-range 64 \
  -p $((secs * 1000)) --max-trials 1 --json "$out/mlp.json" >/dev/null 2>&1 &
loadpid=$!
sleep 1.5
taskset -c "$client_cpu" wrk -t1 -c1 -d$((secs - 3))s --latency \
  "http://127.0.0.1:$port/v2/health/live" >"$out/health.txt"
wait $loadpid || true
echo "health/live under mlp_onnx c=64: p50=$(awk '/ 50%/ {print $2}' "$out/health.txt") p90=$(awk '/ 90%/ {print $2}' "$out/health.txt") p99=$(awk '/ 99%/ {print $2}' "$out/health.txt") max=$(awk '/Latency/ {print $4}' "$out/health.txt")"
echo "mlp_onnx c=64 (same run): $(summary "$out/mlp.json")"

# 2. simple over HTTP JSON
body='{"inputs":[{"name":"INPUT0","datatype":"INT32","shape":[1,16],"data":[0,1,2,3,4,5,6,7,8,9,10,11,12,13,14,15]},{"name":"INPUT1","datatype":"INT32","shape":[1,16],"data":[1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1]}]}'
printf 'wrk.method = "POST"\nwrk.body = %s\nwrk.headers["Content-Type"] = "application/json"\n' "'$body'" >"$out/post.lua"
for c in 1 64; do
  threads=1; [ "$c" -gt 1 ] && threads=2
  taskset -c "$client_cpu" wrk -t$threads -c$c -d${secs}s --latency -s "$out/post.lua" \
    "http://127.0.0.1:$port/v2/models/simple/infer" >"$out/wrk.txt"
  echo "simple http-json c=$c: req/s=$(awk '/Requests\/sec/ {print $2}' "$out/wrk.txt") p50=$(awk '/ 50%/ {print $2}' "$out/wrk.txt") p99=$(awk '/ 99%/ {print $2}' "$out/wrk.txt")"
done
stop

# 3. mlp_onnx_dyna with 1, 2, 4 instances
for n in 1 2 4; do
  repo="$out/repo$n"; mkdir -p "$repo"
  cp -r models/mlp_onnx_dyna "$repo/"
  sed -i "s/instance_group \[ { count: 1, kind: KIND_CPU } \]/instance_group [ { count: $n, kind: KIND_CPU } ]/" "$repo/mlp_onnx_dyna/config.pbtxt"
  start "$repo"
  before=$(cpu_ticks "$pid")
  taskset -c "$client_cpu" "$bench" -m mlp_onnx_dyna -u 127.0.0.1:$port --concurrency-range 64 \
    -p $((secs * 1000 / 2)) --max-trials 2 --json "$out/dyna.json" >/dev/null 2>&1 || true
  after=$(cpu_ticks "$pid")
  curl -s "http://127.0.0.1:$port/v2/models/mlp_onnx_dyna/stats" >"$out/stats.json"
  python3 - "$out/dyna.json" "$out/stats.json" "$n" "$before" "$after" "$(getconf CLK_TCK)" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))["steps"][-1]
st = json.load(open(sys.argv[2]))["model_stats"][0]
ex, inf = int(st["execution_count"]), int(st["inference_count"])
sizes = sorted(((b["batch_size"], int(b["compute_infer"]["count"])) for b in st["batch_stats"]), key=lambda x: -x[1])[:4]
print(f"mlp_onnx_dyna x{sys.argv[3]} c=64: infer/s={s['throughput']:.0f} p50={s['latency_us']['p50']:.0f}us p99={s['latency_us']['p99']:.0f}us mean batch={inf/max(ex,1):.1f} top (batch size, executions)={sizes}")
(c0, s0), (c1, s1), hz = map(int, sys.argv[4].split()), map(int, sys.argv[5].split()), int(sys.argv[6])
compute_s, shard_s = (c1 - c0) / hz, (s1 - s0) / hz
if compute_s > 0:
    print(f"  server CPU during the run: compute workers {compute_s:.1f}s, shard {shard_s:.1f}s; "
          f"{inf / compute_s:.0f} infer per compute-CPU-second (all inferences since start)")
PY
  stop
done
