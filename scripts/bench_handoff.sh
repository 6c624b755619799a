#!/usr/bin/env bash
# Issue 26, compute hand-off and the batched ONNX Runtime ratio: two server
# binaries A/B in one run, rounds alternated, server pinned to SERVER_CPU
# with one shard (its compute worker shares that CPU), the generator on
# CLIENT_CPU. Loopback only, bounded in time (about ROUNDS * 2 * 9 * (SECONDS + 3) s).
# Prints one line per figure:
#
#   mlp_onnx c=64 and c=1, compute worker (default) vs
#     shardserve_execution "inline": infer/s, p50, p99, and for the worker
#     run the server's context switches per request (all its threads)
#   /v2/health/live p50/p99 (wrk, one connection) during the c=64 worker run
#   mlp_onnx_dyna c=64 over HTTP JSON, HTTP binary and gRPC: infer/s, the
#     shard's and the compute worker's CPU microseconds per inference, and
#     infer/s over ONNX Runtime alone (scripts/bench_ort_direct.py, batch
#     64, one thread, on SERVER_CPU)
#   a last block: each figure's NEW/BASE ratio of the medians
#
# Usage: scripts/bench_handoff.sh BASE_BIN NEW_BIN [SECONDS=5] [ROUNDS=2] [SERVER_CPU=0] [CLIENT_CPU=1]
#   BENCH=path/to/shardserve-bench (default target/release/shardserve-bench)
#   NEW_ARGS="..." extra server flags for NEW_BIN only (e.g. --tuning-profile
#   FILE with [compute] spin_us / pipeline_depth, to measure one setting)
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/lib.sh
source scripts/lib.sh
base=${1:?usage: bench_handoff.sh BASE_BIN NEW_BIN [SECONDS] [ROUNDS] [SERVER_CPU] [CLIENT_CPU]}
new=${2:?usage: bench_handoff.sh BASE_BIN NEW_BIN [SECONDS] [ROUNDS] [SERVER_CPU] [CLIENT_CPU]}
secs=${3:-5}
rounds=${4:-2}
server_cpu=${5:-0}
client_cpu=${6:-1}
bench=${BENCH:-target/release/shardserve-bench}
python=${PYTHON:-.venv/bin/python}
# Binaries copied out of the build tree find ONNX Runtime through this.
if [ -z "${SHARDSERVE_ORT_LIB:-}" ] && [ -e .ort/libonnxruntime.so ]; then
  SHARDSERVE_ORT_LIB=$(readlink -f .ort/libonnxruntime.so)
  export SHARDSERVE_ORT_LIB
fi
out=$(mktemp -d)
pid=
trap '[ -n "$pid" ] && kill "$pid" 2>/dev/null; rm -rf "$out"' EXIT
port=18300

# Repositories: mlp_onnx on its worker, mlp_onnx inline, mlp_onnx_dyna.
mkdir -p "$out/worker" "$out/inline" "$out/dyna"
cp -r models/mlp_onnx "$out/worker/"
cp -r models/mlp_onnx "$out/inline/"
cat >>"$out/inline/mlp_onnx/config.pbtxt" <<'EOF'
parameters { key: "shardserve_execution" value { string_value: "inline" } }
EOF
cp -r models/mlp_onnx_dyna "$out/dyna/"

start() { # binary repo [extra flags]
  # shellcheck disable=SC2086
  taskset -c "$server_cpu" "$1" --model-repository "$2" --host 127.0.0.1 \
    --http-port $port --grpc-port $((port + 1)) --metrics-port $((port + 2)) \
    --cores 1 ${3:-} >"$out/server.log" 2>&1 &
  pid=$!
  ss_wait_ready $port || { echo "server did not become ready:"; cat "$out/server.log"; exit 1; }
}
stop() { kill -TERM "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; pid=; }

# "compute_ticks shard_ticks switches inferences" of the server's threads
# and MODEL's inference count.
counters() { # pid model
  local infer
  infer=$(curl -sf "http://127.0.0.1:$port/v2/models/$2/stats" \
    | python3 -c 'import json,sys; print(json.load(sys.stdin)["model_stats"][0]["inference_count"])' \
    2>/dev/null || echo 0)
  echo "$(ss_thread_counters "$1") $infer"
}

# label json before after -> one result line, also appended to $out/results
record() {
  python3 - "$@" "$(getconf CLK_TCK)" <<'PY' | tee -a "$out/results"
import json, sys
label, path, before, after, hz = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5])
s = json.load(open(path))["steps"][-1]
c0, s0, w0, i0 = map(int, before.split())
c1, s1, w1, i1 = map(int, after.split())
# CPU and switches are over the whole bench run (all its trials), so they
# are divided by the inferences the server counted in that time.
n = max(i1 - i0, 1)
print(f"{label}: infer/s={s['throughput']:.0f} p50_us={s['latency_us']['p50']:.0f} "
      f"p99_us={s['latency_us']['p99']:.0f} compute_cpu_us_per_infer={(c1 - c0) / hz / n * 1e6:.1f} "
      f"shard_cpu_us_per_infer={(s1 - s0) / hz / n * 1e6:.1f} switches_per_infer={(w1 - w0) / n:.2f}")
PY
}

wrk_us() { # percentile wrk-output -> microseconds
  awk -v p="$1%" '$1 == p {
    v = $2; u = v; sub(/[0-9.]+/, "", u); sub(/[a-z]+$/, "", v)
    f = (u == "ms") ? 1000 : (u == "s") ? 1000000 : 1
    printf "%.0f", v * f }' "$2"
}

run_bench() { # label model json url extra-args...
  local label=$1 model=$2 json=$3 url=$4
  shift 4
  local before after
  rm -f "$json"
  before=$(counters "$pid" "$model")
  taskset -c "$client_cpu" "$bench" -m "$model" -u "$url" "$@" \
    -p $((secs * 1000)) --max-trials 2 --json "$json" >"$out/bench.log" 2>&1 || true
  after=$(counters "$pid" "$model")
  if [ -s "$json" ]; then
    record "$label" "$json" "$before" "$after"
  else
    echo "$label: FAILED $(tail -n 3 "$out/bench.log" | tr '\n' ' ')" | tee -a "$out/results"
  fi
}

ort=$(taskset -c "$server_cpu" "$python" scripts/bench_ort_direct.py models/mlp_onnx_dyna 3 \
  | awk '/^batch +64:/ {print $5}')
echo "ort-direct mlp_onnx_dyna batch 64, one thread on CPU $server_cpu: infer/s=$ort"

for round in $(seq 1 "$rounds"); do
  for side in base new; do
    bin=$base extra=
    [ "$side" = new ] && bin=$new extra=${NEW_ARGS:-}
    tag="round=$round $side"

    start "$bin" "$out/worker" "$extra"
    # Health probes during the c=64 worker run.
    taskset -c "$client_cpu" wrk -t1 -c1 -d$((secs + 2))s --latency \
      "http://127.0.0.1:$port/v2/health/live" >"$out/health.txt" 2>&1 &
    wrkpid=$!
    run_bench "$tag mlp_onnx c=64 worker" mlp_onnx "$out/j.json" 127.0.0.1:$port --concurrency-range 64
    wait $wrkpid || true
    echo "$tag health/live during mlp_onnx c=64 worker: p50_us=$(wrk_us 50 "$out/health.txt") p99_us=$(wrk_us 99 "$out/health.txt")" | tee -a "$out/results"
    run_bench "$tag mlp_onnx c=1 worker" mlp_onnx "$out/j.json" 127.0.0.1:$port --concurrency-range 1
    stop

    start "$bin" "$out/inline" "$extra"
    run_bench "$tag mlp_onnx c=64 inline" mlp_onnx "$out/j.json" 127.0.0.1:$port --concurrency-range 64
    run_bench "$tag mlp_onnx c=1 inline" mlp_onnx "$out/j.json" 127.0.0.1:$port --concurrency-range 1
    stop

    start "$bin" "$out/dyna" "$extra"
    run_bench "$tag mlp_onnx_dyna c=64 http-json" mlp_onnx_dyna "$out/j.json" 127.0.0.1:$port \
      --concurrency-range 64 --input-tensor-format json --output-tensor-format json
    run_bench "$tag mlp_onnx_dyna c=64 http-binary" mlp_onnx_dyna "$out/j.json" 127.0.0.1:$port --concurrency-range 64
    run_bench "$tag mlp_onnx_dyna c=64 grpc" mlp_onnx_dyna "$out/j.json" \
      127.0.0.1:$((port + 1)) -i grpc --concurrency-range 64
    stop
  done
done

# Medians per figure and side, the ratio NEW/BASE, and the dyna runs' CPU
# per inference and ratio to ONNX Runtime alone.
python3 - "$out/results" "$ort" "$secs" <<'PY'
import re, statistics, sys
from collections import defaultdict
ort = float(sys.argv[2] or 0)
vals = defaultdict(lambda: defaultdict(list))
for line in open(sys.argv[1]):
    m = re.match(r"round=\d+ (base|new) (.*?): (.*)$", line.strip())
    if not m or "FAILED" in m.group(3):
        continue
    side, fig, rest = m.groups()
    kv = dict(re.findall(r"(\w+)=([\d.]+)", rest))
    for k, v in kv.items():
        vals[(fig, k)][side].append(float(v))
    t = re.search(r"infer/s=([\d.]+)", rest)
    if t:
        vals[(fig, "infer/s")][side].append(float(t.group(1)))
def med(fig, key, side):
    xs = vals[(fig, key)][side]
    return statistics.median(xs) if xs else float("nan")
figs = sorted({f for f, _ in vals})
for fig in figs:
    for key in ("infer/s", "p50_us", "p99_us", "shard_cpu_us_per_infer",
                "compute_cpu_us_per_infer", "switches_per_infer"):
        b, n = med(fig, key, "base"), med(fig, key, "new")
        if b == b and n == n:
            print(f"median {fig} {key}: base={b:.1f} new={n:.1f} new/base={n / b if b else float('nan'):.2f}")
for side in ("base", "new"):
    w, i = med("mlp_onnx c=64 worker", "infer/s", side), med("mlp_onnx c=64 inline", "infer/s", side)
    print(f"{side} mlp_onnx c=64 worker/inline={w / i if i else float('nan'):.2f} ({w:.0f} vs {i:.0f} infer/s)")
    for proto in ("http-json", "http-binary", "grpc"):
        fig = f"mlp_onnx_dyna c=64 {proto}"
        t = med(fig, "infer/s", side)
        print(f"{side} {fig}: infer/s={t:.0f} ratio_to_ort_alone={t / ort if ort else float('nan'):.2f}")
PY
