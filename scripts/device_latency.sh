#!/usr/bin/env bash
# Issue 26's figures on a lent 16-core machine, as one bounded script (each
# step under `timeout`, loopback only, results written to OUT_DIR as they
# come so a cut-off run still returns what it measured):
#
#   1. concurrency-1 latency of `simple` over HTTP JSON, HTTP binary and
#      gRPC, spin window off vs 250 us, against the sockperf loopback floor,
#      with the idle CPU of each (scripts/bench_latency_floor.sh; server
#      CPU 0, generator CPU 1)
#   1b. (section "direct") c=1 with the server's 250 us window, measured
#      by shardserve-bench through its runtime (--no-direct) and directly
#   1c. (section "driver") c=1 with the 250 us window, shards on io_uring
#      against epoll (tuning/low-latency.toml's pairing)
#   2. the compute hand-off on one shared core: unbatched `mlp_onnx` at
#      concurrency 64 inline, on its compute worker with the default
#      profile (SCHED_BATCH shards, [compute] slice_us 500) and variants of
#      it, and with tuning/preempting-shards.toml; CPU per inference of
#      the shard and compute threads, context switches per inference, and
#      /v2/health/live p50/p99 from wrk on a CPU of its own (server CPU 0,
#      generator CPU 1, wrk CPU 2)
#   3. `mlp_onnx_dyna` at concurrency 64 over HTTP binary and gRPC vs ONNX
#      Runtime alone (scripts/bench_ort_direct.py where that machine's
#      python3 has onnxruntime)
#   4. `simple` scaling at 1, 2, 4, 8 and 16 shards (generator on CPUs 8-15)
#   4b. (section "owner") `simple` at 8 shards with and without its owner
#      shard taking connections
#   4c. (section "spread") `simple` with 8 inline instances at 8 shards,
#      spread over the shards against all on the owner
#   5. ONNX Runtime on the GPU: where that machine's Python has an
#      onnxruntime with the CUDA provider, `mlp_onnx_dyna` with a KIND_GPU
#      instance behind the server vs ORT alone on the GPU
#
# BIN_DIR: stripped shardserve and shardserve-bench, libhwloc.so.15,
# libudev.so.1, libonnxruntime.so(.xz), and optionally sockperf, wrk and
# libluajit-5.1.so.2. Usage: scripts/device_latency.sh BIN_DIR OUT_DIR
# env: SECTIONS="latency direct driver handoff dyna scaling owner spread gpu" (which to run),
#   LATENCY_ROUNDS=3, HANDOFF_ROUNDS=2,
#   HANDOFF="inline default default-slice0 preempting" (server set-ups:
#   inline; the default profile or preempting-shards, each with an
#   optional -sliceN for [compute] slice_us = N),
#   DYNA_PROFILES="default" (the same names, for section 3), DYNA_ROUNDS=1
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

# shellcheck source=scripts/lib.sh
source scripts/lib.sh
want() { [[ " ${SECTIONS:-latency direct driver handoff dyna scaling owner spread gpu} " == *" $1 "* ]]; }
# profile_flags NAME: the --tuning-profile flags for a set-up name above.
profile_flags() {
  local base=${1%-slice*} slice=
  [[ $1 == *-slice* ]] && slice=${1##*-slice}
  local file=tuning/default.toml
  [ "$base" = preempting ] && file=tuning/preempting-shards.toml
  if [ -n "$slice" ]; then # both profiles end in their [compute] table, or have none
    { grep -v '^slice_us' "$file"; grep -q '^\[compute\]' "$file" || echo '[compute]'; echo "slice_us = $slice"; } >"$work/$1.toml"
    echo "--tuning-profile $work/$1.toml"
  elif [ "$base" = preempting ]; then
    echo "--tuning-profile $file"
  fi
}
ready() { ss_wait_ready "$1" || { echo "server on $1 never became ready"; return 1; }; }
stop() { [ -n "$pid" ] && { kill -TERM "$pid" 2>/dev/null; wait "$pid" 2>/dev/null; }; pid=; }

{
  nproc; uname -r; nvidia-smi -L 2>&1 | head -2
  lscpu | grep -E '^(Model name|Thread|Core|Socket|NUMA node\(s\))' || true
  timeout 20 python3 -c 'import onnxruntime as o, os; print("python onnxruntime", o.__version__, o.get_available_providers(), os.path.dirname(o.__file__))' 2>&1 | tail -1
} >"$out/machine.txt" 2>&1

# 1. c=1 latency, spin off (A) vs 250 us (B), same binaries. A round is
# about 40 s here; the floor and the idle CPU about 40 s more.
if want latency; then
  lr=${LATENCY_ROUNDS:-3}
  ROUNDS=$lr SECONDS_PER=2 IDLE_SECS=5 NEW_ARGS="--spin-us 250" timeout $((lr * 60 + 90)) \
    scripts/bench_latency_floor.sh "$bin/shardserve" "$bin/shardserve" \
    "$bin/shardserve-bench" "$bin/shardserve-bench" >"$out/latency.txt" 2>&1
  echo "bench_latency_floor rc=$?" >>"$out/latency.txt"
fi

# wrapper NAME BIN ARGS...: $work/NAME runs BIN with its arguments and ARGS.
wrapper() {
  local name=$1 target=$2; shift 2
  printf '#!/bin/sh\nexec "%s" "$@" %s\n' "$target" "$*" >"$work/$name"
  chmod +x "$work/$name"
}
# floor_ab NAME SERVER_A SERVER_B BENCH_A BENCH_B: a c=1 A/B of
# bench_latency_floor.sh into $out/NAME.txt (idle CPU barely looked at).
floor_ab() {
  local name=$1 lr=${LATENCY_ROUNDS:-3}; shift
  ROUNDS=$lr SECONDS_PER=2 IDLE_SECS=1 timeout $((lr * 60 + 60)) \
    scripts/bench_latency_floor.sh "$@" >"$out/$name.txt" 2>&1
  echo "bench_latency_floor rc=$?" >>"$out/$name.txt"
}

# 1b. The generator's direct lane at c=1: the same server (spin window
# 250 us) measured by the bench with --no-direct (A) and without (B).
if want direct; then
  wrapper spin250 "$bin/shardserve" --spin-us 250
  wrapper bench-no-direct "$bin/shardserve-bench" --no-direct
  floor_ab direct "$work/spin250" "$work/spin250" "$work/bench-no-direct" "$bin/shardserve-bench"
fi

# 1c. The shard's driver with the 250 us window: io_uring (A) against
# epoll (B), as tuning/low-latency.toml pairs them; the bench direct.
if want driver; then
  wrapper uring250 "$bin/shardserve" --spin-us 250 --io-driver io-uring
  wrapper epoll250 "$bin/shardserve" --spin-us 250 --io-driver epoll
  floor_ab driver "$work/uring250" "$work/epoll250" "$bin/shardserve-bench" "$bin/shardserve-bench"
fi

# 2. Hand-off on one shared core (repositories made when the section runs).
inferences() { curl -sf "http://127.0.0.1:$1/v2/models/$2/stats" |
  python3 -c 'import json,sys; print(json.load(sys.stdin)["model_stats"][0]["inference_count"])' 2>/dev/null || echo 0; }
handoff() { # label repo [server flags...]
  local label=$1 repo=$2 port=18600; shift 2
  taskset -c 0 "$bin/shardserve" --model-repository "$repo" --host 127.0.0.1 --http-port $port \
    --grpc-port $((port + 1)) --metrics-port $((port + 2)) --cores 1 "$@" >"$out/handoff-server.log" 2>&1 &
  pid=$!
  ready $port || { stop; return; }
  local c0 n0 c1 n1 wpid=
  c0=$(ss_thread_counters "$pid"); n0=$(inferences $port mlp_onnx)
  if command -v wrk >/dev/null; then
    timeout 20 taskset -c 2 wrk -t1 -c1 -d6s --latency "http://127.0.0.1:$port/v2/health/live" >"$work/wrk.txt" 2>&1 &
    wpid=$!
  fi
  timeout 40 taskset -c 1 "$bin/shardserve-bench" -m mlp_onnx -u 127.0.0.1:$port --concurrency-range 64 \
    -p 2000 --max-trials 2 --no-progress --json "$work/h.json" >"$work/h.txt" 2>&1
  [ -n "$wpid" ] && wait "$wpid"
  c1=$(ss_thread_counters "$pid"); n1=$(inferences $port mlp_onnx)
  stop
  python3 - "$label" "$c0" "$c1" "$n0" "$n1" "$work/h.json" "$work/wrk.txt" "$(getconf CLK_TCK)" <<'PY'
import json, re, sys
label, c0, c1, n0, n1, path, wrk, hz = sys.argv[1:9]
(cc0, cs0, sw0), (cc1, cs1, sw1) = ([int(v) for v in c.split()] for c in (c0, c1))
n, hz = max(int(n1) - int(n0), 1), int(hz)
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
print(f"{label}: infer/s={rate:.0f} p50_us={p50:.0f} shard_cpu_us={(cs1 - cs0) * 1e6 / hz / n:.0f} "
      f"compute_cpu_us={(cc1 - cc0) * 1e6 / hz / n:.0f} switches_per_infer={(sw1 - sw0) / n:.2f} "
      f"health_p50_us={us(50):.0f} health_p99_us={us(99):.0f}")
PY
}
if want handoff; then
  mkdir -p "$work/worker" "$work/inline"
  cp -r models/mlp_onnx "$work/worker/"; cp -r models/mlp_onnx "$work/inline/"
  echo 'parameters { key: "shardserve_execution" value { string_value: "inline" } }' \
    >>"$work/inline/mlp_onnx/config.pbtxt"
  for round in $(seq 1 "${HANDOFF_ROUNDS:-2}"); do
    for setup in ${HANDOFF:-inline default default-slice0 preempting}; do
      if [ "$setup" = inline ]; then
        handoff "round=$round inline" "$work/inline"
      else
        # shellcheck disable=SC2046
        handoff "round=$round worker $setup" "$work/worker" $(profile_flags "$setup")
      fi
    done
  done 2>&1 | tee "$out/handoff.txt"
fi

# 3. Batched ORT behind the server vs ORT alone, one core.
want dyna && {
  timeout 30 taskset -c 0 python3 scripts/bench_ort_direct.py models/mlp_onnx_dyna 3 2>&1 | tail -5
  mkdir -p "$work/dyna"; cp -r models/mlp_onnx_dyna "$work/dyna/"
  for round in $(seq 1 "${DYNA_ROUNDS:-1}"); do for prof in ${DYNA_PROFILES:-default}; do
    # shellcheck disable=SC2207
    flags=($(profile_flags "$prof"))
    taskset -c 0 "$bin/shardserve" --model-repository "$work/dyna" --host 127.0.0.1 --http-port 18620 \
      --grpc-port 18621 --metrics-port 18622 --cores 1 "${flags[@]}" >"$out/dyna-server.log" 2>&1 &
    pid=$!
    if ready 18620; then
      for proto in http grpc; do
        p=18620; [ $proto = grpc ] && p=18621
        echo "== round=$round mlp_onnx_dyna c=64 $proto profile=$prof"
        timeout 40 taskset -c 1 "$bin/shardserve-bench" -m mlp_onnx_dyna -u 127.0.0.1:$p -i $proto \
          --concurrency-range 64 -p 2000 --max-trials 2 --no-progress 2>&1 | tail -n 2
      done
    fi
    stop
  done; done
} >"$out/dyna.txt" 2>&1

# simple_load PORT LABEL [NOTE]: `simple` at c=256 from CPUs 8-15 over HTTP
# (PORT) and gRPC (PORT+1) against the server $pid, with each shard's busy
# share: `simple` has one instance, so one shard owns its queue and runs
# every batch; this tells an owner-bound run from a generator-bound one.
simple_load() {
  local port=$1 label=$2 note=${3:-} proto p t0 s0
  for proto in http grpc; do
    p=$port; [ $proto = grpc ] && p=$((port + 1))
    echo "== $label $proto$note"
    t0=$(ss_shard_ticks "$pid"); s0=$(date +%s.%N)
    timeout 60 "$bin/shardserve-bench" -m simple -u 127.0.0.1:$p -i $proto \
      --concurrency-range 256 --cpu 8-15 --connections 4 -p 1500 --max-trials 3 \
      --no-progress 2>&1 | tail -n 2
    ss_shard_busy "$t0" "$(ss_shard_ticks "$pid")" "$s0"
  done
}

# 4. Scaling of `simple`.
want scaling && {
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
  simple_load $port "shards=$n" "$note"
  stop
done >"$out/scaling.txt" 2>&1
}

# load_on_8 PORT LABEL REPO FLAGS...: a server of REPO on CPUs 0-7 with
# FLAGS, loaded by simple_load, then stopped.
load_on_8() {
  local port=$1 label=$2 repo=$3; shift 3
  taskset -c 0-7 "$bin/shardserve" --model-repository "$repo" --host 127.0.0.1 \
    --http-port $port --grpc-port $((port + 1)) --metrics-port $((port + 2)) "$@" \
    >"$work/load8-server.log" 2>&1 &
  pid=$!
  if ready $port; then
    simple_load $port "$label"
  else
    tail -n 5 "$work/load8-server.log"
  fi
  stop
}

# 4b. (section "owner") `simple` at 8 shards as in 4, then with its owner
# shard taking no connections (a profile with accept = shards 1-7,
# compute = shard 0): whether the owner's own connections or its share of
# every request is what bounds a `count: 1` model.
want owner && {
repo=$work/simple; mkdir -p "$repo"; cp -r models/simple "$repo/"
printf 'name = "owner-apart"\n[shards]\ncpus = [0, 1, 2, 3, 4, 5, 6, 7]\naccept = [1, 2, 3, 4, 5, 6, 7]\ncompute = [0]\n' >"$work/owner.toml"
port=19200
for setup in default owner-apart; do
  port=$((port + 10))
  flags=(--cores 8); [ $setup = owner-apart ] && flags=(--tuning-profile "$work/owner.toml")
  load_on_8 $port "shards=8 $setup" "$repo" "${flags[@]}"
done >"$out/owner.txt" 2>&1
}

# 4c. (section "spread") `simple` with 8 inline instances at 8 shards:
# spread over the shards (the default: each shard queues and runs its own
# requests) against all on the owner (shardserve_instance_placement
# "owner"), which is the 4b bound again.
want spread && {
port=19300
for placement in spread owner; do
  port=$((port + 10))
  repo=$work/spread-$placement; mkdir -p "$repo"; cp -r models/simple "$repo/"
  sed -i 's/count: 1/count: 8/' "$repo/simple/config.pbtxt"
  [ $placement = owner ] && echo 'parameters { key: "shardserve_instance_placement" value: { string_value: "owner" } }' >>"$repo/simple/config.pbtxt"
  load_on_8 $port "shards=8 count=8 $placement" "$repo" --cores 8
done >"$out/spread.txt" 2>&1
}

# 5. ONNX Runtime on the GPU, where that machine's Python has it.
want gpu && {
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
}

cat "$out/latency.txt" "$out/direct.txt" "$out/driver.txt" "$out/handoff.txt" "$out/dyna.txt" "$out/scaling.txt" "$out/owner.txt" "$out/spread.txt" "$out/gpu-ort.txt" >"$out/all.txt" 2>/dev/null
echo done >>"$out/all.txt"
