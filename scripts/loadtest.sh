#!/usr/bin/env bash
# Load test of `simple` with independent tools: wrk (HTTP/1.1 JSON) and
# h2load (gRPC over h2c), server pinned to one CPU and the load generator
# to another so they do not share a core. Loopback only, bounded in time.
#
# Usage: scripts/loadtest.sh [SECONDS=10] [SERVER_CPU=0] [CLIENT_CPU=1]
# Prints one line per run: tool, mode, concurrency, req/s, latency summary.
set -euo pipefail
cd "$(dirname "$0")/.."
secs=${1:-10}
server_cpu=${2:-0}
client_cpu=${3:-1}
bin=target/release/shardserve
[ -x "$bin" ] || scripts/setup.sh
out=$(mktemp -d)
trap 'kill "$pid" 2>/dev/null || true; rm -rf "$out"' EXIT

port_http=18000; port_grpc=18001; port_metrics=18002
taskset -c "$server_cpu" "$bin" --model-repository models --host 127.0.0.1 \
  --http-port $port_http --grpc-port $port_grpc --metrics-port $port_metrics \
  --cores 1 --no-pin >"$out/server.log" 2>&1 &
pid=$!
for _ in $(seq 1 100); do
  curl -sf "http://127.0.0.1:$port_http/v2/health/ready" >/dev/null 2>&1 && break
  sleep 0.1
done

# The JSON body tritonclient sends for simple (two INT32 [1,16] inputs).
body='{"inputs":[{"name":"INPUT0","datatype":"INT32","shape":[1,16],"data":[0,1,2,3,4,5,6,7,8,9,10,11,12,13,14,15]},{"name":"INPUT1","datatype":"INT32","shape":[1,16],"data":[1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1]}]}'
cat > "$out/post.lua" <<LUA
wrk.method = "POST"
wrk.body = '$body'
wrk.headers["Content-Type"] = "application/json"
LUA

# A framed gRPC ModelInferRequest (raw_input_contents), built with the
# client's own protobuf classes.
.venv/bin/python - "$out/infer.grpc" <<'PY'
import struct, sys
import numpy as np
from tritonclient.grpc import service_pb2
req = service_pb2.ModelInferRequest(model_name="simple")
for name in ("INPUT0", "INPUT1"):
    req.inputs.add(name=name, datatype="INT32", shape=[1, 16])
req.raw_input_contents.append(np.arange(16, dtype=np.int32).tobytes())
req.raw_input_contents.append(np.ones(16, dtype=np.int32).tobytes())
msg = req.SerializeToString()
open(sys.argv[1], "wb").write(b"\x00" + struct.pack(">I", len(msg)) + msg)
PY

for c in 1 64; do
  threads=1; [ "$c" -gt 1 ] && threads=2
  taskset -c "$client_cpu" wrk -t$threads -c$c -d${secs}s --latency -s "$out/post.lua" \
    "http://127.0.0.1:$port_http/v2/models/simple/infer" >"$out/wrk_$c.txt"
  rps=$(awk '/Requests\/sec/ {print $2}' "$out/wrk_$c.txt")
  p50=$(awk '/ 50%/ {print $2}' "$out/wrk_$c.txt"); p99=$(awk '/ 99%/ {print $2}' "$out/wrk_$c.txt")
  echo "wrk   http-json  c=$c  req/s=$rps  p50=$p50  p99=$p99"
done

for spec in "1 1" "4 16"; do
  set -- $spec
  conns=$1; streams=$2
  taskset -c "$client_cpu" h2load -c "$conns" -m "$streams" -D "$secs" -d "$out/infer.grpc" \
    -H 'content-type: application/grpc' -H 'te: trailers' \
    "http://127.0.0.1:$port_grpc/inference.GRPCInferenceService/ModelInfer" >"$out/h2_$conns.txt" 2>&1 || true
  rps=$(awk '/finished in/ {print $4}' "$out/h2_$conns.txt")
  ok=$(awk '/^requests:/ {print $8, $9}' "$out/h2_$conns.txt")
  lat=$(awk '/time for request:/ {print "min="$4, "max="$5, "mean="$6}' "$out/h2_$conns.txt")
  echo "h2load grpc      conns=$conns streams=$streams  req/s=$rps  succeeded: $ok  $lat"
done
