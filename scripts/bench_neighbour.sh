#!/usr/bin/env bash
# A neighbour's latency under load (issue 26): how long a unary gRPC call
# at concurrency 1 on its own connection waits while another client loads
# the same one-shard server. The load is `simple` at concurrency 64 over
# gRPC, `--streaming` (ModelStreamInfer) unless LOAD_ARGS says otherwise
# (LOAD_ARGS="" for unary). Server on SERVER_CPU, the neighbour's
# generator on CLIENT_CPU, the load's on LOAD_CPU (default CLIENT_CPU: on
# 2 cores they share it, the load at nice 19 so the neighbour's generator
# gets the core when its answer arrives). NEIGHBOUR_MODEL (default
# `simple`) is the neighbour's model: another model (say `simple_int8`)
# keeps it out of the load's model queue, so only the connections' share
# of the shard is measured. Binaries alternated over ROUNDS.
# Loopback only, bounded in time (every step under `timeout`).
#
# Usage: scripts/bench_neighbour.sh BIN_A [BIN_B ...]
#   env: ROUNDS=2 LOAD_ARGS=--streaming SERVER_CPU=0 CLIENT_CPU=1 LOAD_CPU=CLIENT_CPU
#        PORT=20100 NEIGHBOUR_MODEL=simple
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/lib.sh
source scripts/lib.sh
[ $# -ge 1 ] || { sed -n '2,14p' "$0" >&2; exit 2; }
rounds=${ROUNDS:-2}
load_args=${LOAD_ARGS---streaming}
scpu=${SERVER_CPU:-0}
ccpu=${CLIENT_CPU:-1}
lcpu=${LOAD_CPU:-$ccpu}
port=${PORT:-20100}
nmodel=${NEIGHBOUR_MODEL:-simple}
bench=target/release/shardserve-bench
work=$(mktemp -d)
spid=
trap '[ -n "$spid" ] && kill "$spid" 2>/dev/null; rm -rf "$work"' EXIT

for r in $(seq 1 "$rounds"); do
  for bin in "$@"; do
    port=$((port + 3))
    taskset -c "$scpu" "$bin" --model-repository models --host 127.0.0.1 --http-port $port \
      --grpc-port $((port + 1)) --metrics-port $((port + 2)) --model-control-mode explicit \
      --load-model simple --load-model "$nmodel" --cores 1 >"$work/server.log" 2>&1 &
    spid=$!
    ss_wait_ready $port || { tail -n 5 "$work/server.log"; exit 1; }
    # shellcheck disable=SC2086 # LOAD_ARGS is a list of flags
    timeout 30 nice -n 19 taskset -c "$lcpu" "$bench" -m simple -i grpc -u 127.0.0.1:$((port + 1)) \
      $load_args --concurrency-range 64 -p 4000 --max-trials 1 --no-progress >"$work/load.txt" 2>&1 &
    lpid=$!
    sleep 0.5
    timeout 30 taskset -c "$ccpu" "$bench" -m "$nmodel" -i grpc -u 127.0.0.1:$((port + 1)) \
      --concurrency-range 1 -p 2000 --max-trials 1 --no-progress >"$work/neighbour.txt" 2>&1 || true
    wait $lpid || true
    load=$(grep -A1 Concurrency "$work/load.txt" | tail -n 1 | awk '{print $2}')
    grep -A1 Concurrency "$work/neighbour.txt" | tail -n 1 |
      awk -v b="$bin" -v r="$r" -v l="$load" \
        '{printf "%s round=%d load_infer_s=%s neighbour_p50_us=%s neighbour_p99_us=%s\n", b, r, l, $4, $7}'
    kill $spid; wait $spid 2>/dev/null || true; spid=
  done
done
