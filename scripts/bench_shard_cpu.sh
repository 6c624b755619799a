#!/usr/bin/env bash
# The shard's CPU per request (issue 26): one-shard servers on SERVER_CPU,
# shardserve-bench at CONCURRENCY on CLIENT_CPU, MODEL over HTTP JSON, HTTP
# binary and gRPC (one connection, as perf_analyzer's default). For each
# binary (A B A B ... over ROUNDS) and protocol (`stream` is gRPC's
# ModelStreamInfer, one stream per outstanding request): infer/s, p50, and the
# shard thread's task-clock per request (perf stat on that thread for 3 s
# inside the bench's measurement; the model's compute worker, if any, is
# not counted). Loopback only, bounded in time (every step under
# `timeout`). ONNX models need SHARDSERVE_ORT_LIB when the binaries are not
# in target/release (the .venv's library is used if set up).
#
# Usage: scripts/bench_shard_cpu.sh BIN_A [BIN_B]
#   env: MODEL=simple CONCURRENCY=64 ROUNDS=1 PROTOS="json binary grpc" (or stream)
#        SERVER_CPU=0 CLIENT_CPU=1 PORT=18900
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/lib.sh
source scripts/lib.sh
bins=("$1"); [ $# -gt 1 ] && bins+=("$2")
model=${MODEL:-simple}
conc=${CONCURRENCY:-64}
rounds=${ROUNDS:-1}
protos=${PROTOS:-json binary grpc}
scpu=${SERVER_CPU:-0}
ccpu=${CLIENT_CPU:-1}
port=${PORT:-18900}
bench=target/release/shardserve-bench
ss_export_ort_lib
command -v perf >/dev/null || { echo "perf is required" >&2; exit 1; }
work=$(mktemp -d)
spid=
trap '[ -n "$spid" ] && kill "$spid" 2>/dev/null; rm -rf "$work"' EXIT
mkdir -p "$work/repo"; cp -r "models/$model" "$work/repo/"

count() { # inferences of $model so far
  curl -s "127.0.0.1:$((port + 2))/metrics" |
    awk -v m="$model" '$0 ~ "^nv_inference_count\\{model=\""m"\"" {s += $2} END {print s + 0}'
}

for r in $(seq 1 "$rounds"); do
  for i in "${!bins[@]}"; do
    which=$([ "$i" = 0 ] && echo A || echo B)
    port=$((port + 3))
    taskset -c "$scpu" "${bins[$i]}" --model-repository "$work/repo" --host 127.0.0.1 \
      --http-port $port --grpc-port $((port + 1)) --metrics-port $((port + 2)) --cores 1 \
      >"$work/server.log" 2>&1 &
    spid=$!
    ss_wait_ready $port || { tail -n 5 "$work/server.log"; exit 1; }
    tid=$(ss_thread_id $spid shard-0)
    for proto in $protos; do
      case $proto in
        json) args=(-i http -u 127.0.0.1:$port --input-tensor-format json --output-tensor-format json) ;;
        binary) args=(-i http -u 127.0.0.1:$port) ;;
        grpc) args=(-i grpc -u 127.0.0.1:$((port + 1))) ;;
        stream) args=(-i grpc -u 127.0.0.1:$((port + 1)) --streaming) ;;
        *) echo "unknown protocol $proto (json binary grpc stream)" >&2; exit 2 ;;
      esac
      timeout 60 taskset -c "$ccpu" "$bench" -m "$model" "${args[@]}" --concurrency-range "$conc" \
        -p 5000 --max-trials 1 --no-progress >"$work/bench.txt" 2>&1 &
      bpid=$!
      sleep 1.5
      n0=$(count)
      timeout 10 perf stat -e task-clock -t "$tid" -x, -o "$work/stat.txt" -- sleep 3
      n1=$(count)
      wait $bpid || true
      row=$(grep -A1 Concurrency "$work/bench.txt" | tail -n 1)
      awk -F, -v w=$which -v r=$r -v p=$proto -v n=$((n1 - n0)) -v row="$row" '
        /task-clock/ {split(row, f, " ");
          printf "%s round=%d proto=%s infer_s=%s p50_us=%s shard_us_per_request=%.2f\n", w, r, p, f[2], f[4], $1 * 1000 / n}' \
        "$work/stat.txt"
    done
    kill $spid; wait $spid 2>/dev/null || true; spid=
  done
done
