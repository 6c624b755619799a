#!/usr/bin/env bash
# The rate limiter's overhead on `simple`: one binary, limiter off vs
# `--rate-limit execution_count` with `simple` asking for a resource that is
# always free (one instance, R:1, nothing else needs R), alternated for
# ROUNDS rounds. Server on SERVER_CPU with one shard, shardserve-bench (HTTP,
# binary tensors) on CLIENT_CPU, concurrency 1 and 64. Prints one line per
# mode, concurrency and round, then the mean throughput ratio on/off.
# Loopback only, bounded in time.
#
# (BENCH=path overrides the load generator.)
# Usage: scripts/bench_rate_limit.sh [BIN=target/release/shardserve] [SECONDS=5] [ROUNDS=3] [SERVER_CPU=0] [CLIENT_CPU=1] [PORT=18000]
set -euo pipefail
cd "$(dirname "$0")/.."
bin=${1:-target/release/shardserve}
secs=${2:-5}
rounds=${3:-3}
server_cpu=${4:-0}
client_cpu=${5:-1}
port=${6:-18000}
bench=${BENCH:-target/release/shardserve-bench}
out=$(mktemp -d)
pid=
trap '[ -n "$pid" ] && kill "$pid" 2>/dev/null; rm -rf "$out"' EXIT

repo="$out/repo"
mkdir -p "$repo"
cp -r models/simple "$repo/"
sed -i 's/instance_group \[ { count: 1, kind: KIND_CPU } \]/instance_group [ { count: 1, kind: KIND_CPU, rate_limiter { resources [ { name: "R" count: 1 } ] } } ]/' \
  "$repo/simple/config.pbtxt"
grep -q rate_limiter "$repo/simple/config.pbtxt" || { echo "could not add rate_limiter to simple"; exit 1; }

start() { # extra server args...
  port=$((port + 3))
  taskset -c "$server_cpu" "$bin" --model-repository "$repo" --host 127.0.0.1 \
    --http-port "$port" --grpc-port $((port + 1)) --metrics-port $((port + 2)) \
    --cores 1 "$@" >"$out/server.log" 2>&1 &
  pid=$!
  for _ in $(seq 1 200); do
    curl -sf "http://127.0.0.1:$port/v2/health/ready" >/dev/null 2>&1 && return 0
    sleep 0.1
  done
  echo "server did not become ready:"; cat "$out/server.log"; exit 1
}
stop() { kill -TERM "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; pid=; }

for r in $(seq 1 "$rounds"); do
  for mode in off on; do
    if [ $mode = on ]; then
      start --rate-limit execution_count --rate-limit-resource R:1
    else
      start --rate-limit off
    fi
    for c in 1 64; do
      taskset -c "$client_cpu" "$bench" -m simple -u 127.0.0.1:$port \
        --concurrency-range "$c" -p $((secs * 1000)) --max-trials 1 --cpu "$client_cpu" \
        --json "$out/r.json" >/dev/null 2>&1 || true
      python3 - "$out/r.json" "$mode" "$c" "$r" <<'PY' | tee -a "$out/all.txt"
import json, sys
s = json.load(open(sys.argv[1]))["steps"][-1]
print(f"{sys.argv[2]} c={sys.argv[3]} round={sys.argv[4]} infer/s={s['throughput']:.0f} "
      f"p50={s['latency_us']['p50']:.0f}us p99={s['latency_us']['p99']:.0f}us")
PY
    done
    stop
  done
done
for c in 1 64; do
  awk -v c="c=$c" '$2 == c { split($4, kv, "="); s[$1] += kv[2]; n[$1]++ }
    END { printf "c=%s: off %.0f infer/s, on %.0f infer/s, on/off %.3f\n", substr(c, 3), s["off"]/n["off"], s["on"]/n["on"], (s["on"]/n["on"]) / (s["off"]/n["off"]) }' "$out/all.txt"
done
