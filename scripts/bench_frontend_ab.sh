#!/usr/bin/env bash
# Two server binaries compared on `simple` over HTTP/1.1 (binary tensors)
# and gRPC (unary, four HTTP/2 connections) at concurrency 1 and 64, measured
# by shardserve-bench. The binaries are alternated for ROUNDS rounds in one
# run (A B A B ...) so both see the same machine; server on SERVER_CPU with
# one shard, the load generator on CLIENT_CPU. Prints one line per binary,
# round, protocol and concurrency, then the mean infer/s and p50 of each and
# the ratio B/A. Loopback only, bounded in time.
#
# Usage: scripts/bench_frontend_ab.sh BIN_A BIN_B [WINDOW_MS=2000] [ROUNDS=3] [SERVER_CPU=0] [CLIENT_CPU=1] [PORT=18200]
set -euo pipefail
cd "$(dirname "$0")/.."
a=$1; b=$2
window=${3:-2000}
rounds=${4:-3}
server_cpu=${5:-0}
client_cpu=${6:-1}
port=${7:-18200}
bench=target/release/shardserve-bench
out=$(mktemp -d)
pid=
trap '[ -n "$pid" ] && kill "$pid" 2>/dev/null; rm -rf "$out"' EXIT

start() { # $1: binary
  port=$((port + 3))
  taskset -c "$server_cpu" "$1" --model-repository models --host 127.0.0.1 \
    --http-port "$port" --grpc-port $((port + 1)) --metrics-port $((port + 2)) \
    --cores 1 >"$out/server.log" 2>&1 &
  pid=$!
  for _ in $(seq 1 200); do
    curl -sf "http://127.0.0.1:$port/v2/health/ready" >/dev/null 2>&1 && return
    sleep 0.1
  done
  echo "server did not start:"; cat "$out/server.log"; exit 1
}

run_bench() { # $1: label, rest: bench arguments
  local label=$1; shift
  taskset -c "$client_cpu" "$bench" -m simple --concurrency-range 1,64 -p "$window" \
    --cpu "$client_cpu" -q --no-progress -f "$out/r.csv" "$@" >/dev/null
  awk -F, -v l="$label" 'NR > 1 { printf "%s c=%s infer/s=%.0f p50_us=%s\n", l, $1, $2, $10 }' \
    "$out/r.csv" | tee -a "$out/all.txt"
}

for r in $(seq 1 "$rounds"); do
  for which in A B; do
    bin=$a; [ "$which" = B ] && bin=$b
    start "$bin"
    # Four HTTP/2 connections: over one, c=64 runs in lockstep batches and
    # the server's core idles while the client answers (66-72 % busy on
    # the 2-core VM, with this bench and with h2load alike).
    run_bench "$which round=$r grpc" -i grpc -u "127.0.0.1:$((port + 1))" --connections 4
    run_bench "$which round=$r http" -u "127.0.0.1:$port"
    kill -TERM "$pid"; wait "$pid" || true; pid=
  done
done
echo "--- means over $rounds rounds"
for proto in http grpc; do
  for c in 1 64; do
    awk -v p="$proto" -v c="c=$c" '$3 == p && $4 == c {
        split($5, t, "="); split($6, l, "="); s[$1] += t[2]; q[$1] += l[2]; n[$1]++ }
      END { printf "%s %s: A %.0f infer/s p50 %.0f us | B %.0f infer/s p50 %.0f us | B/A throughput %.3f p50 %.3f\n",
        p, c, s["A"]/n["A"], q["A"]/n["A"], s["B"]/n["B"], q["B"]/n["B"],
        (s["B"]/n["B"]) / (s["A"]/n["A"]), (q["B"]/n["B"]) / (q["A"]/n["A"]) }' "$out/all.txt"
  done
done
