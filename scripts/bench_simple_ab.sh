#!/usr/bin/env bash
# `simple` over HTTP JSON (wrk) at concurrency 1 and 64, two server
# binaries alternated for ROUNDS rounds in one run (A B A B ...), server on
# SERVER_CPU with one shard, wrk on CLIENT_CPU. Prints one line per binary,
# concurrency and round, then the mean req/s ratio B/A per concurrency.
# Loopback only, bounded in time.
#
# Usage: scripts/bench_simple_ab.sh BIN_A BIN_B [SECONDS=5] [ROUNDS=3] [SERVER_CPU=0] [CLIENT_CPU=1] [PORT=18000]
set -euo pipefail
cd "$(dirname "$0")/.."
a=$1; b=$2
secs=${3:-5}
rounds=${4:-3}
server_cpu=${5:-0}
client_cpu=${6:-1}
port=${7:-18000}
out=$(mktemp -d)
pid=
trap '[ -n "$pid" ] && kill "$pid" 2>/dev/null; rm -rf "$out"' EXIT
body='{"inputs":[{"name":"INPUT0","datatype":"INT32","shape":[1,16],"data":[0,1,2,3,4,5,6,7,8,9,10,11,12,13,14,15]},{"name":"INPUT1","datatype":"INT32","shape":[1,16],"data":[1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1]}]}'
printf 'wrk.method = "POST"\nwrk.body = %s\nwrk.headers["Content-Type"] = "application/json"\n' "'$body'" >"$out/post.lua"

for r in $(seq 1 "$rounds"); do
  for which in A B; do
    bin=$a; [ $which = B ] && bin=$b
    port=$((port + 3))
    taskset -c "$server_cpu" "$bin" --model-repository models --host 127.0.0.1 \
      --http-port "$port" --grpc-port $((port + 1)) --metrics-port $((port + 2)) \
      --cores 1 >"$out/server.log" 2>&1 &
    pid=$!
    for _ in $(seq 1 200); do
      curl -sf "http://127.0.0.1:$port/v2/health/ready" >/dev/null 2>&1 && break
      sleep 0.1
    done
    for c in 1 64; do
      threads=1; [ "$c" -gt 1 ] && threads=2
      taskset -c "$client_cpu" wrk -t$threads -c$c -d${secs}s --latency -s "$out/post.lua" \
        "http://127.0.0.1:$port/v2/models/simple/infer" >"$out/wrk.txt"
      rps=$(awk '/Requests\/sec/ {print $2}' "$out/wrk.txt")
      echo "$which c=$c round=$r req/s=$rps p50=$(awk '/ 50%/ {print $2}' "$out/wrk.txt") p99=$(awk '/ 99%/ {print $2}' "$out/wrk.txt")" | tee -a "$out/all.txt"
    done
    kill -TERM "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; pid=
  done
done
for c in 1 64; do
  awk -v c="c=$c" '$2 == c { split($4, kv, "="); s[$1] += kv[2]; n[$1]++ }
    END { printf "c=%s: A %.0f req/s, B %.0f req/s, B/A %.3f\n", substr(c, 3), s["A"]/n["A"], s["B"]/n["B"], (s["B"]/n["B"]) / (s["A"]/n["A"]) }' "$out/all.txt"
done
