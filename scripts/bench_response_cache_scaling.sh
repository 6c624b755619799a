#!/usr/bin/env bash
# The response cache across shards: `simple` over HTTP with SHARDS shards
# (cores 0..SHARDS-1) and shardserve-bench on the next SHARDS cores, cycling
# through KEYS different requests, with the cache off, on with a 64 MiB cache
# (16 segments, one lock each) and on with a 4 MiB cache (1 segment: one lock
# every shard takes). Every request after the first KEYS is a hit.
#
# (MAX_TRIALS=N: most windows per step, default 6.)
# Usage: scripts/bench_response_cache_scaling.sh [SHARDS=8] [KEYS=1024] [BIN=target/release] [PORT=18200]
set -euo pipefail
cd "$(dirname "$0")/.."
shards=${1:-8}
keys=${2:-1024}
bin=${3:-target/release}
port=${4:-18200}
out=$(mktemp -d)
pid=
trap '[ -n "$pid" ] && kill "$pid" 2>/dev/null; rm -rf "$out"' EXIT
mkdir -p "$out/repo"
cp -r models/simple "$out/repo/"
printf '\nresponse_cache { enable: true }\n' >>"$out/repo/simple/config.pbtxt"
python3 - "$keys" >"$out/data.json" <<'PY'
import json, sys
n = int(sys.argv[1])
print(json.dumps({"data": [{"INPUT0": [i] * 16, "INPUT1": list(range(16))} for i in range(n)]}))
PY
server_cpus=0-$((shards - 1))
client_cpus=$shards-$((2 * shards - 1))

run() {
  local label=$1; shift
  port=$((port + 3))
  taskset -c "$server_cpus" "$bin/shardserve" --model-repository "$out/repo" --host 127.0.0.1 \
    --http-port "$port" --grpc-port $((port + 1)) --metrics-port $((port + 2)) --cores "$shards" "$@" \
    >"$out/server.log" 2>&1 &
  pid=$!
  for _ in $(seq 1 300); do
    curl -sf "http://127.0.0.1:$port/v2/health/ready" >/dev/null 2>&1 && break
    sleep 0.1
  done
  for c in 1 64 512; do
    local cpus=$client_cpus
    [ "$c" = 1 ] && cpus=$shards
    "$bin/shardserve-bench" -m simple -u "127.0.0.1:$port" --concurrency-range "$c" -p 1500 \
      --max-trials "${MAX_TRIALS:-6}" -s 25 --cpu "$cpus" --input-data "$out/data.json" --no-progress -q \
      --json "$out/r.json" >/dev/null
    python3 - "$label" "$c" "$out/r.json" <<'PY'
import json, sys
label, c, path = sys.argv[1:]
def find(o):
    if isinstance(o, dict):
        if "latency_us" in o:
            return o
        o = list(o.values())
    if isinstance(o, list):
        for v in o:
            f = find(v)
            if f:
                return f
step = find(json.load(open(path))) or {}
lat = step.get("latency_us", {})
print(f"{label:10} c={c:<4} infer/s={step.get('throughput', 0):.0f} p50={lat.get('p50', 0):.0f}us p99={lat.get('p99', 0):.0f}us")
PY
  done
  curl -s "http://127.0.0.1:$((port + 2))/metrics" | grep -E '^nv_cache_num_(hits|misses)_per_model' || true
  kill -TERM "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; pid=
}

run off
run seg16 --cache-config local,size=67108864
run seg1 --cache-config local,size=4194304
run miss --cache-config local,size=1
