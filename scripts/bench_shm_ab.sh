#!/usr/bin/env bash
# shardserve-bench --shared-memory none vs system against one shardserve:
# `simple` (-b 1, 128 B in) and `mlp_onnx` (-b 16, 16 KiB in, 16 KiB out),
# over HTTP and gRPC, at concurrency 1 and 8. Server on SERVER_CPU with one
# shard, generator on CLIENT_CPU; none and system alternate within each
# round (their order swapped every round). Prints one line per figure, then
# per model, protocol and concurrency the mean infer/s and p50 of each mode
# and the ratios system/none. Loopback only; every bench run has a timeout
# (worst case about ROUNDS × 8 × 40 s; typically ROUNDS × 8 × 4 s).
#
# Usage: scripts/bench_shm_ab.sh SERVER_BIN BENCH_BIN [WINDOW_MS=1000] [ROUNDS=3]
#        [SERVER_CPU=0] [CLIENT_CPU=1] [PORT=18300]
set -uo pipefail
cd "$(dirname "$0")/.."
if [ $# -lt 2 ]; then
  echo "usage: $0 SERVER_BIN BENCH_BIN [WINDOW_MS] [ROUNDS] [SERVER_CPU] [CLIENT_CPU] [PORT]" >&2
  exit 2
fi
server=$(realpath "$1"); bench=$(realpath "$2")
window=${3:-1000}; rounds=${4:-3}; server_cpu=${5:-0}; client_cpu=${6:-1}; port=${7:-18300}
http=$port; grpc=$((port + 1)); metrics=$((port + 2))
if [ -z "${SHARDSERVE_ORT_LIB:-}" ] && [ -e .ort/libonnxruntime.so ]; then
  SHARDSERVE_ORT_LIB=$(readlink -f .ort/libonnxruntime.so)
  export SHARDSERVE_ORT_LIB
fi
out=$(mktemp -d)
pid=
stop() {
  [ -n "$pid" ] || return 0
  kill -TERM "$pid" 2>/dev/null
  for _ in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  kill -KILL "$pid" 2>/dev/null
  wait "$pid" 2>/dev/null
  pid=
}
trap 'stop; rm -rf "$out"' EXIT

for p in "$http" "$grpc" "$metrics"; do
  if (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null; then
    echo "port $p already answers on 127.0.0.1: pick another PORT"; exit 1
  fi
done
taskset -c "$server_cpu" "$server" --model-repository models --host 127.0.0.1 \
  --model-control-mode explicit --load-model simple --load-model mlp_onnx \
  --http-port "$http" --grpc-port "$grpc" --metrics-port "$metrics" --cores 1 \
  >"$out/server.log" 2>&1 &
pid=$!
ok=
for _ in $(seq 1 600); do
  kill -0 "$pid" 2>/dev/null || break
  if curl -sf -m 1 "http://127.0.0.1:$http/v2/health/ready" >/dev/null 2>&1; then ok=1; break; fi
  sleep 0.1
done
if [ -z "$ok" ]; then
  echo "server not ready after 60 s; its log:"; tail -20 "$out/server.log"; exit 1
fi

# One bench run: both concurrencies, one line per figure.
measure() { # model batch proto shm round
  local model=$1 batch=$2 proto=$3 shm=$4 round=$5 addr csv="$out/run.csv"
  addr=127.0.0.1:$http; [ "$proto" = grpc ] && addr=127.0.0.1:$grpc
  rm -f "$csv"
  if ! timeout -k 2 40 "$bench" -m "$model" -b "$batch" -i "$proto" -u "$addr" \
    --shared-memory "$shm" --concurrency-range 1,8 -p "$window" --max-trials 3 \
    --warmup 200 --cpu "$client_cpu" -q --no-progress -f "$csv" 2>"$out/err"; then
    echo "model=$model b=$batch proto=$proto shm=$shm round=$round FAILED: $(tail -1 "$out/err")"
    return
  fi
  # CSV columns: 1 Concurrency, 2 Inferences/Second, 10 p50 latency (µs).
  awk -F, -v m="$model" -v b="$batch" -v p="$proto" -v s="$shm" -v r="$round" \
    'NR > 1 { printf "model=%s b=%s proto=%s c=%s shm=%s round=%s infer/s=%.0f p50_us=%s\n", m, b, p, $1, s, r, $2, $10 }' \
    "$csv" | tee -a "$out/all.txt"
}

for r in $(seq 1 "$rounds"); do
  order="none system"; [ $((r % 2)) -eq 0 ] && order="system none"
  for cfg in "simple 1" "mlp_onnx 16"; do
    set -- $cfg
    for proto in http grpc; do
      for shm in $order; do measure "$1" "$2" "$proto" "$shm" "$r"; done
    done
  done
done

echo "--- means over $rounds round(s); ratios system/none"
awk '{
    for (i = 1; i <= NF; i++) { split($i, kv, "="); f[kv[1]] = kv[2] }
    k = f["model"] " b=" f["b"] " " f["proto"] " c=" f["c"]
    keys[k] = 1; ips[k, f["shm"]] += f["infer/s"]; p50[k, f["shm"]] += f["p50_us"]; n[k, f["shm"]]++
  }
  END {
    for (k in keys) {
      if (!n[k, "none"] || !n[k, "system"]) continue
      a = ips[k, "none"] / n[k, "none"]; b = ips[k, "system"] / n[k, "system"]
      pa = p50[k, "none"] / n[k, "none"]; pb = p50[k, "system"] / n[k, "system"]
      printf "%s: none %.0f/s p50 %.0f us; system %.0f/s p50 %.0f us; infer/s x%.3f p50 x%.3f\n", k, a, pa, b, pb, b / a, pb / pa
    }
  }' "$out/all.txt" | sort
