#!/usr/bin/env bash
# Batched ONNX Runtime behind the server against ONNX Runtime alone, and
# where the difference goes (issue 26). Per round: ORT alone
# (scripts/bench_ort_direct.py, one thread on SERVER_CPU, batches 32 and
# 64), then a one-shard server on SERVER_CPU (its compute worker shares
# that CPU) with `mlp_onnx_dyna` at concurrency 64 from CLIENT_CPU over
# gRPC and HTTP binary. For each: infer/s, mean batch, the shard's and the
# compute worker's CPU per inference, ORT's own time per inference inside
# the server (the executions' compute_infer over the inferences), the
# ratio to ORT alone at batch 64 and 32, and two ceilings: the ratio if the
# shard cost nothing (ORT alone over the compute worker's CPU alone), and
# the kernel ceiling, the ratio if only the shard's user-space work cost
# nothing (its system time, socket reads and writes and their loopback
# delivery, is still paid on the shared core). The shard's CPU is printed
# split into user and system time.
# PROTOS takes grpc (unary ModelInfer), stream (ModelStreamInfer, as
# perf_analyzer's --streaming) and binary (HTTP with the binary extension).
# At CONCURRENCY=64 the batcher forms two batches of 32 in flight; 128
# keeps batches of 64 (the model's max_batch_size) forming.
# Alone and served alternate within a round because this VM's speed drifts
# by 20 % and more between minutes. Loopback only, bounded in time (about
# ROUNDS * 25 s).
#
# Usage: scripts/bench_batched_ratio.sh BIN [ROUNDS=3]
#   env: SERVER_CPU=0 CLIENT_CPU=1 PORT=18500 PROTOS="grpc binary" CONCURRENCY=64
#        BENCH=target/release/shardserve-bench PYTHON=.venv/bin/python
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/lib.sh
source scripts/lib.sh
bin=${1:?usage: bench_batched_ratio.sh BIN [ROUNDS]}
rounds=${2:-3}
scpu=${SERVER_CPU:-0}
ccpu=${CLIENT_CPU:-1}
port=${PORT:-18500}
protos=${PROTOS:-grpc binary}
python=${PYTHON:-.venv/bin/python}
bench=${BENCH:-target/release/shardserve-bench}
ss_export_ort_lib
work=$(mktemp -d)
spid=
trap '[ -n "$spid" ] && kill "$spid" 2>/dev/null; rm -rf "$work"' EXIT
mkdir -p "$work/repo"; cp -r models/mlp_onnx_dyna "$work/repo/"
stats() { curl -sf "127.0.0.1:$port/v2/models/mlp_onnx_dyna/stats"; }

for round in $(seq 1 "$rounds"); do
  read -r o32 o64 < <(timeout 60 taskset -c "$scpu" "$python" scripts/bench_ort_direct.py models/mlp_onnx_dyna 2 |
    awk '/^batch +32:/ {a = $5} /^batch +64:/ {b = $5} END {print a, b}')
  for proto in $protos; do
    case $proto in
      grpc) args=(-i grpc -u 127.0.0.1:$((port + 1))) ;;
      stream) args=(-i grpc --streaming -u 127.0.0.1:$((port + 1))) ;;
      binary) args=(-i http -u 127.0.0.1:$port) ;;
      *) echo "unknown protocol $proto (grpc stream binary)" >&2; exit 2 ;;
    esac
    taskset -c "$scpu" "$bin" --model-repository "$work/repo" --host 127.0.0.1 --http-port "$port" \
      --grpc-port $((port + 1)) --metrics-port $((port + 2)) --cores 1 >"$work/server.log" 2>&1 &
    spid=$!
    ss_wait_ready "$port" || { echo "server did not become ready:"; cat "$work/server.log"; exit 1; }
    timeout 30 taskset -c "$ccpu" "$bench" -m mlp_onnx_dyna "${args[@]}" --concurrency-range "${CONCURRENCY:-64}" \
      -p 6000 --max-trials 1 >"$work/bench.log" 2>&1 &
    bpid=$!
    sleep 2
    w0=$(date +%s.%N); s0=$(stats); t0=$(ss_thread_stat "$spid")
    sleep 3
    s1=$(stats); t1=$(ss_thread_stat "$spid"); w1=$(date +%s.%N)
    wait "$bpid" || true
    kill "$spid" 2>/dev/null || true; wait "$spid" 2>/dev/null || true; spid=
    python3 - "$s0" "$s1" "$t0" "$t1" "$o32" "$o64" "round=$round $proto" "$(getconf CLK_TCK)" "$w0" "$w1" <<'PY'
import json, sys
s0, s1 = (json.loads(x)["model_stats"][0] for x in sys.argv[1:3])
t0, t1 = (list(map(int, x.split())) for x in sys.argv[3:5])
o32, o64, label, hz = float(sys.argv[5]), float(sys.argv[6]), sys.argv[7], int(sys.argv[8])
seconds = float(sys.argv[10]) - float(sys.argv[9])
n = max(s1["inference_count"] - s0["inference_count"], 1)
executions = max(s1["execution_count"] - s0["execution_count"], 1)
def batch_ns(s):
    return sum(b["compute_infer"]["ns"] for b in s["batch_stats"])
ort_us = (batch_ns(s1) - batch_ns(s0)) / n / 1000
# ss_thread_stat: compute user, compute sys, shard user, shard sys, switches.
per_infer = [(b - a) / hz / n * 1e6 for a, b in zip(t0, t1)]
compute_us = per_infer[0] + per_infer[1]
shard_user_us, shard_sys_us = per_infer[2], per_infer[3]
shard_us = shard_user_us + shard_sys_us
rate = n / seconds
print(f"{label}: infer/s={rate:.0f} mean_batch={n / executions:.1f} shard_us_per_infer={shard_us:.1f} "
      f"(user={shard_user_us:.1f} sys={shard_sys_us:.1f}) compute_us_per_infer={compute_us:.1f} ort_in_server_us_per_infer={ort_us:.1f} "
      f"ort_alone_infer_s b32={o32:.0f} b64={o64:.0f} ratio_b64={rate / o64:.2f} ratio_b32={rate / o32:.2f} "
      f"ceiling_b64={1e6 / compute_us / o64:.2f} kernel_ceiling_b64={1e6 / (compute_us + shard_sys_us) / o64:.2f}")
PY
  done
done
