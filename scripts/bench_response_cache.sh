#!/usr/bin/env bash
# `simple` with the response cache off, on with every request a hit, and on
# with every request a miss (a 1-byte cache: looked up, copied, refused),
# at concurrency 1 and 64, server on SERVER_CPU with one shard and
# shardserve-bench on CLIENT_CPU. The bench sends the same inputs every time,
# so with a cache every request after the first is a hit.
#
# Usage: scripts/bench_response_cache.sh [SECONDS=5] [PROTOCOL=http] [SERVER_CPU=0] [CLIENT_CPU=1] [PORT=18100]
set -euo pipefail
cd "$(dirname "$0")/.."
secs=${1:-5}
protocol=${2:-http}
server_cpu=${3:-0}
client_cpu=${4:-1}
port=${5:-18100}
out=$(mktemp -d)
pid=
trap '[ -n "$pid" ] && kill "$pid" 2>/dev/null; rm -rf "$out"' EXIT
mkdir -p "$out/repo"
cp -r models/simple "$out/repo/"
printf '\nresponse_cache { enable: true }\n' >>"$out/repo/simple/config.pbtxt"

run() {
  local label=$1; shift
  port=$((port + 3))
  taskset -c "$server_cpu" target/release/shardserve --model-repository "$out/repo" --host 127.0.0.1 \
    --http-port "$port" --grpc-port $((port + 1)) --metrics-port $((port + 2)) --cores 1 "$@" \
    >"$out/server.log" 2>&1 &
  pid=$!
  for _ in $(seq 1 200); do
    curl -sf "http://127.0.0.1:$port/v2/health/ready" >/dev/null 2>&1 && break
    sleep 0.1
  done
  local url=127.0.0.1:$port
  [ "$protocol" = grpc ] && url=127.0.0.1:$((port + 1))
  for c in 1 64; do
    taskset -c "$client_cpu" target/release/shardserve-bench -m simple -u "$url" -i "$protocol" \
      --concurrency-range "$c" -p $((secs * 1000)) --input-data zero --no-progress \
      --json "$out/r.json" >/dev/null
    python3 - "$label" "$c" "$out/r.json" <<'EOF'
import json, sys
label, c, path = sys.argv[1:]
r = json.load(open(path))
def find(o):
    if isinstance(o, dict):
        if "latency_us" in o:
            return o
        for v in o.values():
            f = find(v)
            if f: return f
    if isinstance(o, list):
        for v in o:
            f = find(v)
            if f: return f
step = find(r) or {}
tp = step.get("throughput", step.get("infer_per_sec"))
lat = step.get("latency_us", {})
print(f"{label:6} c={c:<3} infer/s={tp:.0f} p50={lat.get('p50', 0):.0f}us p99={lat.get('p99', 0):.0f}us")
EOF
  done
  curl -s "http://127.0.0.1:$((port + 2))/metrics" | grep -E '^nv_cache_num_(hits|misses)_per_model' || true
  kill -TERM "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; pid=
}

run off
run hit --cache-config local,size=67108864
run miss --cache-config local,size=1
