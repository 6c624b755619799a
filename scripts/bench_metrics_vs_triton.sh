#!/usr/bin/env bash
# shardserve-bench --collect-metrics and --profile-export-file against real
# tritonserver 2.51 (Python backend, py_simple), loopback, bounded: prints
# the bench's measured request count, the server's request delta over the
# step, the export's request count, and the server's queue/compute per
# request from the metrics page. Usage: scripts/bench_metrics_vs_triton.sh [BENCH]
set -euo pipefail
BENCH=${1:-target/release/shardserve-bench}
TRITON=.backends/python/pytriton/tritonserver/bin/tritonserver
BACKENDS=$(readlink -f .backends)
[ -x "$BENCH" ] || { echo "no bench binary at $BENCH" >&2; exit 1; }
WORK=$(mktemp -d /tmp/bench_metrics.XXXXXX)
PID=
cleanup() { [ -n "$PID" ] && kill "$PID" 2>/dev/null; wait 2>/dev/null || true; rm -rf "$WORK"; }
trap cleanup EXIT
mkdir "$WORK/repo" && cp -r models_python/py_simple "$WORK/repo/"
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
HTTP=$(free_port); GRPC=$(free_port); METRICS=$(free_port)
timeout 300 "$TRITON" --model-repository "$WORK/repo" --backend-directory "$BACKENDS" \
  --http-port "$HTTP" --grpc-port "$GRPC" --metrics-port "$METRICS" --allow-cpu-metrics=true \
  >"$WORK/server.log" 2>&1 &
PID=$!
for _ in $(seq 1 600); do
  curl -sf -o /dev/null "http://127.0.0.1:$HTTP/v2/health/ready" && break
  kill -0 "$PID" 2>/dev/null || { tail -20 "$WORK/server.log" >&2; exit 1; }
  sleep 0.1
done
timeout 120 "$BENCH" -m py_simple -u "127.0.0.1:$HTTP" --concurrency-range 1:2 -p 300 \
  --max-trials 3 --collect-metrics --metrics-url "127.0.0.1:$METRICS" --metrics-interval 100 \
  --profile-export-file "$WORK/profile.json" --json "$WORK/out.json" -q --no-progress
python3 - "$WORK" <<'PY'
import json, sys
w = sys.argv[1]
out = json.load(open(f"{w}/out.json"))
prof = json.load(open(f"{w}/profile.json"))
for step, exp in zip(out["steps"], prof["experiments"]):
    m = step["metrics"]
    model = next(x for x in m["models"] if x["model"] == "py_simple")
    c = step["load"]
    print(f"c={c:g} bench_requests={step['requests']} windows={step['windows']}")
    print(f"c={c:g} server_request_delta={model['requests']} scrapes={m['scrapes']}")
    print(f"c={c:g} export_requests={len(exp['requests'])}")
    print(f"c={c:g} server_queue_us={model['queue_us']:.1f} server_compute_infer_us={model['compute_infer_us']:.1f}")
    print(f"c={c:g} avg_cpu_utilization={m['avg_cpu_utilization']}")
PY
