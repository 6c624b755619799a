#!/usr/bin/env bash
# Issue 26's figures on a lent 16-core machine, as one bounded script (each
# step under `timeout`, loopback only, results written to OUT_DIR as they
# come so a cut-off run still returns what it measured):
#
#   1. concurrency-1 latency of `simple` over HTTP JSON, HTTP binary and
#      gRPC, spin window off vs 250 us, against the sockperf loopback floor
#      (scripts/bench_latency_floor.sh; server CPU 0, generator CPU 1)
#   2. the compute hand-off on one shared core: unbatched `mlp_onnx` at
#      concurrency 64 on its compute worker (default; shards SCHED_OTHER as
#      before `[runtime] sched_batch`; pipeline depth 4 with a 500 us reply
#      hold) vs inline, with context switches per inference and
#      /v2/health/live p50/p99 (wrk) alongside
#   3. `mlp_onnx_dyna` at concurrency 64 over HTTP binary and gRPC (shards
#      SCHED_BATCH and not) vs ONNX Runtime alone (scripts/bench_ort_direct.py where that machine's
#      python3 has onnxruntime)
#   4. `simple` scaling at 1, 2, 4, 8 and 16 shards (generator on CPUs 8-15)
#   5. ONNX Runtime on the GPU: where that machine's Python has an
#      onnxruntime with the CUDA provider, `mlp_onnx` with a KIND_GPU
#      instance behind the server vs ORT alone on the GPU
#
# BIN_DIR: stripped shardserve and shardserve-bench, libhwloc.so.15,
# libudev.so.1, libonnxruntime.so(.xz), and optionally sockperf, wrk and
# libluajit-5.1.so.2. Usage: scripts/device_latency.sh BIN_DIR OUT_DIR
set -uo pipefail
cd "$(dirname "$0")/.."
bin=$(realpath "$1"); out=$(realpath "$2")
export LD_LIBRARY_PATH=$bin${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export PATH=$bin:$PATH
[ -e "$bin/libonnxruntime.so" ] || { [ -e "$bin/libonnxruntime.so.xz" ] && xz -dkc "$bin/libonnxruntime.so.xz" >"$bin/libonnxruntime.so"; }
export SHARDSERVE_ORT_LIB=$bin/libonnxruntime.so
work=$(mktemp -d)
pid=
trap '[ -n "$pid" ] && kill "$pid" 2>/dev/null; rm -rf "$work"' EXIT

ready() {
  for _ in $(seq 1 300); do
    curl -sf "http://127.0.0.1:$1/v2/health/ready" >/dev/null 2>&1 && return 0
    sleep 0.1
  done
  echo "server on $1 never became ready"; return 1
}
stop() { [ -n "$pid" ] && { kill -TERM "$pid" 2>/dev/null; wait "$pid" 2>/dev/null; }; pid=; }

{
  nproc; uname -r; nvidia-smi -L 2>&1 | head -2
  lscpu | grep -E '^(Model name|Thread|Core|Socket|NUMA node\(s\))' || true
  timeout 20 python3 -c 'import onnxruntime as o, os; print("python onnxruntime", o.__version__, o.get_available_providers(), os.path.dirname(o.__file__))' 2>&1 | tail -1
} >"$out/machine.txt" 2>&1

# 1. c=1 latency, spin off (A) vs 250 us (B), same binaries.
ROUNDS=2 SECONDS_PER=1 IDLE_SECS=5 NEW_ARGS="--spin-us 250" timeout 120 \
  scripts/bench_latency_floor.sh "$bin/shardserve" "$bin/shardserve" \
  "$bin/shardserve-bench" "$bin/shardserve-bench" >"$out/latency.txt" 2>&1
echo "bench_latency_floor rc=$?" >>"$out/latency.txt"

# 2. Hand-off on one shared core.
mkdir -p "$work/worker" "$work/inline"
cp -r models/mlp_onnx "$work/worker/"; cp -r models/mlp_onnx "$work/inline/"
echo 'parameters { key: "shardserve_execution" value { string_value: "inline" } }' \
  >>"$work/inline/mlp_onnx/config.pbtxt"
printf '[compute]\npipeline_depth = 4\nreply_hold_us = 500\n' >"$work/hold4.toml"
printf '[runtime]\nsched_batch = false\n' >"$work/other.toml"
switches() { cat /proc/"$pid"/task/*/status 2>/dev/null | awk '/ctxt_switches/ {s += $2} END {print s + 0}'; }
inferences() { curl -sf "http://127.0.0.1:$1/v2/models/$2/stats" |
  python3 -c 'import json,sys; print(json.load(sys.stdin)["model_stats"][0]["inference_count"])' 2>/dev/null || echo 0; }
handoff() { # label repo [server flags...]
  local label=$1 repo=$2 port=18600; shift 2
  taskset -c 0 "$bin/shardserve" --model-repository "$repo" --host 127.0.0.1 --http-port $port \
    --grpc-port $((port + 1)) --metrics-port $((port + 2)) --cores 1 "$@" >"$out/handoff-server.log" 2>&1 &
  pid=$!
  ready $port || { stop; return; }
  local s0 n0 s1 n1 wpid
  s0=$(switches); n0=$(inferences $port mlp_onnx)
  if command -v wrk >/dev/null; then
    timeout 20 taskset -c 1 wrk -t1 -c1 -d6s --latency "http://127.0.0.1:$port/v2/health/live" >"$work/wrk.txt" 2>&1 &
    wpid=$!
  fi
  timeout 40 taskset -c 1 "$bin/shardserve-bench" -m mlp_onnx -u 127.0.0.1:$port --concurrency-range 64 \
    -p 2000 --max-trials 2 --no-progress --json "$work/h.json" >"$work/h.txt" 2>&1
  [ -n "${wpid:-}" ] && wait "$wpid"
  s1=$(switches); n1=$(inferences $port mlp_onnx)
  stop
  python3 - "$label" "$s0" "$s1" "$n0" "$n1" "$work/h.json" "$work/wrk.txt" <<'PY'
import json, re, sys
label, s0, s1, n0, n1, path, wrk = sys.argv[1], *map(int, sys.argv[2:6]), sys.argv[6], sys.argv[7]
try:
    st = json.load(open(path))["steps"][-1]
    rate, p50 = st["throughput"], st["latency_us"]["p50"]
except Exception as e:
    print(f"{label}: FAILED ({e})"); sys.exit()
def us(p):
    try:
        m = re.search(r"^\s*%s%%\s+([\d.]+)(us|ms|s)" % p, open(wrk).read(), re.M)
        return float(m.group(1)) * {"us": 1, "ms": 1000, "s": 1e6}[m.group(2)] if m else -1
    except OSError:
        return -1
print(f"{label}: infer/s={rate:.0f} p50_us={p50:.0f} switches_per_infer={(s1 - s0) / max(n1 - n0, 1):.2f} "
      f"health_p50_us={us(50):.0f} health_p99_us={us(99):.0f}")
PY
}
for round in 1 2; do
  handoff "round=$round worker default" "$work/worker"
  handoff "round=$round worker sched_batch=false" "$work/worker" --tuning-profile "$work/other.toml"
  handoff "round=$round worker depth4 hold500" "$work/worker" --tuning-profile "$work/hold4.toml"
  handoff "round=$round inline" "$work/inline"
done 2>&1 | tee "$out/handoff.txt"

# 3. Batched ORT behind the server vs ORT alone, one core.
{
  timeout 30 taskset -c 0 python3 scripts/bench_ort_direct.py models/mlp_onnx_dyna 3 2>&1 | tail -5
  mkdir -p "$work/dyna"; cp -r models/mlp_onnx_dyna "$work/dyna/"
  for prof in default other; do
    flags=(); [ $prof = other ] && flags=(--tuning-profile "$work/other.toml")
    taskset -c 0 "$bin/shardserve" --model-repository "$work/dyna" --host 127.0.0.1 --http-port 18620 \
      --grpc-port 18621 --metrics-port 18622 --cores 1 "${flags[@]}" >"$out/dyna-server.log" 2>&1 &
    pid=$!
    if ready 18620; then
      for proto in http grpc; do
        p=18620; [ $proto = grpc ] && p=18621
        echo "== mlp_onnx_dyna c=64 $proto profile=$prof"
        timeout 40 taskset -c 1 "$bin/shardserve-bench" -m mlp_onnx_dyna -u 127.0.0.1:$p -i $proto \
          --concurrency-range 64 -p 2000 --max-trials 2 --no-progress 2>&1 | tail -n 2
      done
    fi
    stop
  done
} >"$out/dyna.txt" 2>&1

# 4. Scaling of `simple`.
repo=$work/simple; mkdir -p "$repo"; cp -r models/simple "$repo/"
port=19000
for n in 1 2 4 8 16; do
  port=$((port + 10))
  taskset -c 0-$((n - 1)) "$bin/shardserve" --model-repository "$repo" --host 127.0.0.1 \
    --http-port $port --grpc-port $((port + 1)) --metrics-port $((port + 2)) --cores $n \
    >"$work/scale-server.log" 2>&1 &
  pid=$!
  ready $port || { stop; continue; }
  note=""; [ $n -gt 8 ] && note=" (generator shares cores 8-15 with the server)"
  for proto in http grpc; do
    p=$port; [ $proto = grpc ] && p=$((port + 1))
    echo "== shards=$n $proto$note"
    timeout 60 "$bin/shardserve-bench" -m simple -u 127.0.0.1:$p -i $proto \
      --concurrency-range 256 --cpu 8-15 --connections 4 -p 1500 --max-trials 3 \
      --no-progress 2>&1 | tail -n 2
  done
  stop
done >"$out/scaling.txt" 2>&1

# 5. ONNX Runtime on the GPU, where that machine's Python has it.
gpu_ort=$(timeout 20 python3 -c 'import onnxruntime as o, os, glob
if "CUDAExecutionProvider" in o.get_available_providers():
    print((glob.glob(os.path.join(os.path.dirname(o.__file__), "capi", "libonnxruntime.so*")) or [""])[0])' 2>/dev/null)
{
  if [ -z "$gpu_ort" ]; then
    echo "no onnxruntime with the CUDA provider (and a libonnxruntime.so) in this machine's python3: GPU ORT not measured"
  else
    echo "GPU ONNX Runtime: $gpu_ort"
    mkdir -p "$work/gpu"; cp -r models/mlp_onnx_dyna "$work/gpu/"
    sed -i 's/KIND_CPU/KIND_GPU/' "$work/gpu/mlp_onnx_dyna/config.pbtxt"
    grep -q KIND_GPU "$work/gpu/mlp_onnx_dyna/config.pbtxt" ||
      echo 'instance_group [ { count: 1 kind: KIND_GPU } ]' >>"$work/gpu/mlp_onnx_dyna/config.pbtxt"
    SHARDSERVE_ORT_LIB=$gpu_ort "$bin/shardserve" --model-repository "$work/gpu" --host 127.0.0.1 \
      --http-port 18640 --grpc-port 18641 --metrics-port 18642 >"$out/gpu-server.log" 2>&1 &
    pid=$!
    if ready 18640; then
      for c in 1 64; do
        echo "== mlp_onnx_dyna KIND_GPU c=$c grpc"
        timeout 40 "$bin/shardserve-bench" -m mlp_onnx_dyna -u 127.0.0.1:18641 -i grpc \
          --concurrency-range $c --cpu 8-15 -p 2000 --max-trials 2 --no-progress 2>&1 | tail -n 2
      done
    else
      tail -n 20 "$out/gpu-server.log"
    fi
    stop
    timeout 60 python3 - <<'PY' 2>&1 | tail -n 8
import time, numpy as np, onnxruntime as ort
s = ort.InferenceSession("models/mlp_onnx_dyna/1/model.onnx", providers=["CUDAExecutionProvider"])
i = s.get_inputs()[0]
dims = [d if isinstance(d, int) else 1 for d in i.shape[1:]]
for batch in (1, 64):
    x = np.random.default_rng(0).standard_normal([batch] + dims).astype(np.float32)
    for _ in range(50): s.run(None, {i.name: x})
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < 2: s.run(None, {i.name: x}); n += 1
    dt = time.perf_counter() - t0
    print(f"ORT alone on the GPU, batch {batch}: {n / dt:.0f} exec/s, {n * batch / dt:.0f} infer/s, {dt / n * 1e6:.0f} us/exec")
PY
  fi
} >"$out/gpu-ort.txt" 2>&1

# 6. shardserve-bench shared memory (system and CUDA), where the script exists.
if [ -x scripts/device_bench_shm.sh ]; then
  timeout 90 scripts/device_bench_shm.sh "$bin" "$out" 18700 >"$out/bench-shm.txt" 2>&1
  echo "device_bench_shm rc=$?" >>"$out/bench-shm.txt"
fi
cat "$out/latency.txt" "$out/handoff.txt" "$out/dyna.txt" "$out/scaling.txt" "$out/gpu-ort.txt" >"$out/all.txt" 2>/dev/null
echo done >>"$out/all.txt"
