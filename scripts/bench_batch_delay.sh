#!/usr/bin/env bash
# Dynamic-batching delay precision and cost, two server binaries back to back
# in one run (server on SERVER_CPU with one shard, shardserve-bench on
# CLIENT_CPU). The model is `simple_dyna_batch` with
# max_queue_delay_microseconds = each of DELAYS. Per binary, delay and
# concurrency it prints throughput, latency and the server's CPU time per
# measured second (utime+stime from /proc: at c=1 the shard is mostly
# waiting out the batch window, so a shard that spins while it waits shows
# here).
# Loopback only, bounded in time.
#
# Usage: scripts/bench_batch_delay.sh BIN_A BIN_B [SECONDS=4] [SERVER_CPU=0] [CLIENT_CPU=1] [PORT=18000]
# (uses PORT+3 .. PORT+3*(2*delays+1)+2)
set -euo pipefail
cd "$(dirname "$0")/.."
bins=("$1" "$2")
secs=${3:-4}
server_cpu=${4:-0}
client_cpu=${5:-1}
port=${6:-18000}
delays=${DELAYS:-"500 2000"}
bench=target/release/shardserve-bench
out=$(mktemp -d)
pid=
trap '[ -n "$pid" ] && kill "$pid" 2>/dev/null; rm -rf "$out"' EXIT
tck=$(getconf CLK_TCK)

cpu_ticks() { awk '{print $14 + $15}' "/proc/$pid/stat"; }

start() { # binary repo; each start takes the next three ports, so a
  # previous server's sockets in TIME_WAIT never stand in the way.
  port=$((port + 3))
  taskset -c "$server_cpu" "$1" --model-repository "$2" --host 127.0.0.1 \
    --http-port "$port" --grpc-port $((port + 1)) --metrics-port $((port + 2)) \
    --cores 1 >"$out/server.log" 2>&1 &
  pid=$!
  for _ in $(seq 1 200); do
    curl -sf "http://127.0.0.1:$port/v2/health/ready" >/dev/null 2>&1 && return 0
    sleep 0.1
  done
  echo "server did not become ready:"; cat "$out/server.log"; exit 1
}
stop() { kill -TERM "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; pid=; }

repo_with_delay() { # delay_us -> repo path
  local repo="$out/repo$1"
  mkdir -p "$repo"
  cp -r models/simple_dyna_batch "$repo/"
  sed -i "s/max_queue_delay_microseconds: [0-9]*/max_queue_delay_microseconds: $1/" \
    "$repo/simple_dyna_batch/config.pbtxt"
  echo "$repo"
}

for d in $delays; do
  repo=$(repo_with_delay "$d")
  for bin in "${bins[@]}"; do
    start "$bin" "$repo"
    for c in 1 16; do
      t0=$(cpu_ticks); s0=$(date +%s.%N)
      taskset -c "$client_cpu" "$bench" -m simple_dyna_batch -u 127.0.0.1:$port \
        --concurrency-range "$c" -p $((secs * 1000)) --max-trials 1 --cpu "$client_cpu" \
        --json "$out/r.json" >/dev/null 2>&1 || true
      t1=$(cpu_ticks); run_s=$(python3 -c "print($(date +%s.%N) - $s0)")
      python3 - "$out/r.json" "$bin" "$d" "$c" "$t0" "$t1" "$tck" "$run_s" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))["steps"][-1]
bin, d, c, t0, t1, tck = sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5]), int(sys.argv[6]), int(sys.argv[7])
cpu = (t1 - t0) / tck
print(f"{bin} delay={d}us c={c}: infer/s={s['throughput']:.0f} p50={s['latency_us']['p50']:.0f}us "
      f"p99={s['latency_us']['p99']:.0f}us server-cpu={cpu:.2f}s ({100 * cpu / float(sys.argv[8]):.0f}% of the run)")
PY
    done
    stop
  done
done
