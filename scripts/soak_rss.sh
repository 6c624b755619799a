#!/usr/bin/env bash
# RSS soak per memory allocator: `simple` (HTTP, concurrency 32) and
# `mlp_onnx` (HTTP binary, concurrency 16) driven together for SECONDS
# against one server; RSS sampled every 2 s. Prints per allocator the RSS
# after warm-up (WARMUP seconds), at the end of the load, the peak, 5 s
# after the load stopped, and both loads' throughput. The allocators run
# back to back in one run: glibc (the binary as built), and jemalloc /
# mimalloc through LD_PRELOAD where Debian's libjemalloc2 / libmimalloc2.0
# are installed (skipped otherwise; measurement only, the server does not
# need them). Server on SERVER_CPU with one shard, generators on
# CLIENT_CPU. Loopback only, bounded in time.
#
# Usage: scripts/soak_rss.sh [BINARY=target/release/shardserve] [SECONDS=120] [SERVER_CPU=0] [CLIENT_CPU=1] [PORT=18000]
#   env ALLOCATORS="glibc jemalloc mimalloc" WARMUP=20
set -euo pipefail
cd "$(dirname "$0")/.."
bin=${1:-target/release/shardserve}
secs=${2:-120}
server_cpu=${3:-0}
client_cpu=${4:-1}
port=${5:-18000}
allocators=${ALLOCATORS:-"glibc jemalloc mimalloc"}
warmup=${WARMUP:-20}
bench=target/release/shardserve-bench
lib=/usr/lib/x86_64-linux-gnu
out=$(mktemp -d)
pid=
trap '[ -n "$pid" ] && kill "$pid" 2>/dev/null; rm -rf "$out"' EXIT

rss_mib() { awk '/VmRSS/ {printf "%.1f", $2 / 1024}' "/proc/$pid/status" 2>/dev/null || echo 0; }
tput() { python3 -c "import json,sys; s=json.load(open(sys.argv[1]))['steps'][-1]; print(f\"{s['throughput']:.0f}/s\")" "$1" 2>/dev/null || echo "n/a"; }

for a in $allocators; do
  case $a in
    glibc) preload= ;;
    jemalloc) preload=$lib/libjemalloc.so.2 ;;
    mimalloc) preload=$lib/libmimalloc.so.2 ;;
    *) echo "unknown allocator $a"; continue ;;
  esac
  if [ -n "$preload" ] && [ ! -e "$preload" ]; then echo "$a: $preload not installed, skipped"; continue; fi
  port=$((port + 3))
  LD_PRELOAD=$preload taskset -c "$server_cpu" "$bin" --model-repository models --host 127.0.0.1 \
    --http-port "$port" --grpc-port $((port + 1)) --metrics-port $((port + 2)) \
    --cores 1 >"$out/server.log" 2>&1 &
  pid=$!
  for _ in $(seq 1 200); do
    curl -sf "http://127.0.0.1:$port/v2/health/ready" >/dev/null 2>&1 && break
    sleep 0.1
  done
  idle0=$(rss_mib)
  taskset -c "$client_cpu" "$bench" -m simple -u 127.0.0.1:$port --concurrency-range 32 \
    -p $((secs * 1000)) --max-trials 1 --warmup 0 --cpu "$client_cpu" --json "$out/s.json" >/dev/null 2>&1 &
  l1=$!
  taskset -c "$client_cpu" "$bench" -m mlp_onnx -u 127.0.0.1:$port --concurrency-range 16 \
    -p $((secs * 1000)) --max-trials 1 --warmup 0 --cpu "$client_cpu" --json "$out/m.json" >/dev/null 2>&1 &
  l2=$!
  t0=$(date +%s); warm=; peak=0; last=0
  while kill -0 $l1 2>/dev/null || kill -0 $l2 2>/dev/null; do
    sleep 2
    last=$(rss_mib)
    peak=$(python3 -c "print(max($peak, $last))")
    [ -z "$warm" ] && [ $(( $(date +%s) - t0 )) -ge "$warmup" ] && warm=$last
  done
  wait $l1 $l2 || true
  sleep 5
  after=$(rss_mib)
  echo "$a: RSS idle ${idle0} MiB, after ${warmup}s warm-up ${warm:-n/a} MiB, end of load ${last} MiB, peak ${peak} MiB, 5 s after ${after} MiB; simple c=32 $(tput "$out/s.json"), mlp_onnx c=16 $(tput "$out/m.json")"
  kill -TERM "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; pid=
done
