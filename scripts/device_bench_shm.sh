#!/usr/bin/env bash
# shardserve-bench --shared-memory none|system|cuda against shardserve on
# `models/simple`, over HTTP and gRPC, at concurrency 1 and 16 (short
# windows): one line per run (infer/s, p50), then checks that no system or
# CUDA region stayed registered on the server and no ssbench_* object stayed
# in /dev/shm. For a lent GPU machine; on one without a GPU the cuda runs
# print the bench's "no CUDA device: ..." and the rest still runs.
#
# Loopback only; every step has a timeout and the whole script stays under
# 60 s. Ports: PORT (HTTP), PORT+1 (gRPC), PORT+2 (metrics).
# BIN_DIR holds shardserve and shardserve-bench (and any shared library they
# need that the machine lacks); OUT_DIR receives server.log and the CSVs.
# Usage: scripts/device_bench_shm.sh BIN_DIR OUT_DIR PORT
set -uo pipefail
cd "$(dirname "$0")/.."
if [ $# -ne 3 ]; then
  echo "usage: $0 BIN_DIR OUT_DIR PORT" >&2
  exit 2
fi
bin=$(realpath "$1"); mkdir -p "$2"; out=$(realpath "$2"); port=$3
http=$port; grpc=$((port + 1)); metrics=$((port + 2))
export LD_LIBRARY_PATH=$bin${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
repo=$(mktemp -d); cp -r models/simple "$repo/"
pid=
stop() {
  [ -n "$pid" ] || return 0
  kill -TERM "$pid" 2>/dev/null
  for _ in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  kill -KILL "$pid" 2>/dev/null
  wait "$pid" 2>/dev/null
  pid=
}
trap 'stop; rm -rf "$repo"' EXIT

for p in "$http" "$grpc" "$metrics"; do
  if (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null; then
    echo "port $p already answers on 127.0.0.1: pick another PORT"; exit 1
  fi
done
"$bin/shardserve" --model-repository "$repo" --host 127.0.0.1 --http-port "$http" \
  --grpc-port "$grpc" --metrics-port "$metrics" >"$out/server.log" 2>&1 &
pid=$!
ok=
for _ in $(seq 1 100); do
  kill -0 "$pid" 2>/dev/null || break
  if curl -sf -m 1 "http://127.0.0.1:$http/v2/health/ready" >/dev/null 2>&1; then ok=1; break; fi
  sleep 0.1
done
if [ -z "$ok" ]; then
  echo "server on port $http not ready after 10 s; its log:"; tail -20 "$out/server.log"
  exit 1
fi

failures=0
# Per run at most 2 steps × (100 ms warm-up + 3 × 300 ms windows) plus setup: 6 s bound.
for proto in http grpc; do
  case $proto in http) addr=127.0.0.1:$http ;; grpc) addr=127.0.0.1:$grpc ;; esac
  for shm in none system cuda; do
    csv="$out/$proto-$shm.csv"
    rm -f "$csv"
    timeout -k 1 6 "$bin/shardserve-bench" -m simple -i "$proto" -u "$addr" \
      --shared-memory "$shm" --concurrency-range 1,16 -p 300 --max-trials 3 --warmup 100 \
      -q --no-progress -f "$csv" 2>"$out/$proto-$shm.err"
    rc=$?
    if [ $rc -ne 0 ] || [ ! -s "$csv" ]; then
      echo "proto=$proto shm=$shm FAILED rc=$rc: $(tail -1 "$out/$proto-$shm.err")"
      failures=$((failures + 1))
      continue
    fi
    # CSV columns: 1 Concurrency, 2 Inferences/Second, 10 p50 latency (µs).
    awk -F, -v p="$proto" -v s="$shm" \
      'NR > 1 { printf "proto=%s shm=%s c=%s infer/s=%.0f p50_us=%s\n", p, s, $1, $2, $10 }' "$csv"
  done
done

for kind in cuda system; do
  status=$(curl -s -m 2 "http://127.0.0.1:$http/v2/${kind}sharedmemory/status")
  if [ "$status" = "[]" ]; then
    echo "$kind shm status after the runs: [] (ok)"
  else
    echo "$kind shm status after the runs: ${status:-no answer} (NOT EMPTY)"
    failures=$((failures + 1))
  fi
done
left=$(ls /dev/shm 2>/dev/null | grep -c '^ssbench_')
echo "ssbench_* objects left in /dev/shm: $left"
[ "$left" -eq 0 ] || failures=$((failures + 1))
echo "device_bench_shm: $failures failure(s)"
[ $failures -eq 0 ]
