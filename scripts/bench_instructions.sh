#!/usr/bin/env bash
# Instructions per request on the shard (and the compute worker, if the
# model has one), counted by valgrind's callgrind: a figure that does not
# move with the VM's neighbours, where CPU time per request moved by up to
# 25 % between identical runs on the 2-core VM (issue 26). One-shard
# servers under callgrind (`--io-driver epoll`: valgrind does not run
# io_uring) on SERVER_CPU, shardserve-bench at CONCURRENCY on CLIENT_CPU
# for WARM + WINDOW seconds; the counters are zeroed after WARM seconds and
# dumped after WINDOW more, and divided by the inferences the model counted
# in between. Under callgrind the server runs some 30x slower, so a
# connection carries fewer requests per read than at full speed: compare
# binaries with this, and take time figures from scripts/bench_shard_cpu.sh.
# Loopback only, bounded in time.
#
# Usage: scripts/bench_instructions.sh BIN_A [BIN_B]
#   env: MODEL=simple (from MODEL_REPO=models) PROTOS="grpc" (json binary grpc stream) CONCURRENCY=64 ROUNDS=2
#        WARM=8 WINDOW=8 SERVER_CPU=0 CLIENT_CPU=1 PORT=18800
#        KEEP=DIR keeps each run's dumps in DIR/<A|B>-<proto>-<round>/ for
#        callgrind_annotate (where the instructions go, not only how many)
#   Needs valgrind (apt-get install valgrind); not part of scripts/setup.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/lib.sh
source scripts/lib.sh
command -v valgrind >/dev/null && command -v callgrind_control >/dev/null || {
  echo "valgrind is required (apt-get install valgrind)" >&2
  exit 1
}
bins=("$1"); [ $# -gt 1 ] && bins+=("$2")
model=${MODEL:-simple}
protos=${PROTOS:-grpc}
conc=${CONCURRENCY:-64}
rounds=${ROUNDS:-2}
warm=${WARM:-8}
window=${WINDOW:-8}
scpu=${SERVER_CPU:-0}
ccpu=${CLIENT_CPU:-1}
port=${PORT:-18800}
bench=target/release/shardserve-bench
ss_export_ort_lib
work=$(mktemp -d)
spid=
trap '[ -n "$spid" ] && kill "$spid" 2>/dev/null; rm -rf "$work"' EXIT
mkdir -p "$work/repo"; cp -r "${MODEL_REPO:-models}/$model" "$work/repo/"

count() { # inferences of $model so far
  curl -s "127.0.0.1:$port/v2/models/$model/stats" |
    python3 -c 'import json,sys; print(json.load(sys.stdin)["model_stats"][0]["inference_count"])'
}

# The dump's per-thread files: the total of each, named by what runs in it.
per_thread() { # dir requests label
  python3 - "$@" <<'PY'
import glob, re, sys
d, n, label = sys.argv[1], int(sys.argv[2]), sys.argv[3]
for f in sorted(glob.glob(d + "/cg.*.1-*")):
    text = open(f, errors="replace").read()
    total = re.search(r"^summary: (\d+)", text, re.M)
    if not total or int(total.group(1)) < 1_000_000:
        continue
    if "shard_thread" in text:
        who = "shard"
    elif "compute/worker.rs" in text or "compute::worker" in text:
        who = "compute"
    else:
        who = "other"
    ir = int(total.group(1))
    print(f"{label} thread={who} requests={n} instructions_per_request={ir / max(n, 1):.0f}")
PY
}

for round in $(seq 1 "$rounds"); do
  for i in "${!bins[@]}"; do
    bin=${bins[$i]}; tag=$([ "$i" = 0 ] && echo A || echo B)
    for proto in $protos; do
      rm -f "$work"/cg.*
      taskset -c "$scpu" valgrind --tool=callgrind --separate-threads=yes \
        --compress-strings=no --compress-pos=no --callgrind-out-file="$work/cg.%p" \
        "$bin" --model-repository "$work/repo" --host 127.0.0.1 --http-port "$port" \
        --grpc-port $((port + 1)) --metrics-port $((port + 2)) --cores 1 --io-driver epoll \
        >"$work/server.log" 2>&1 &
      spid=$!
      # Up to 180 s: start-up under callgrind is slow.
      ss_wait_ready "$port" 1800 || { echo "server did not become ready:"; cat "$work/server.log"; exit 1; }
      case $proto in
        json) args=(-i http -u 127.0.0.1:$port --input-tensor-format json --output-tensor-format json) ;;
        binary) args=(-i http -u 127.0.0.1:$port) ;;
        grpc) args=(-i grpc -u 127.0.0.1:$((port + 1))) ;;
        stream) args=(-i grpc -u 127.0.0.1:$((port + 1)) --streaming) ;;
        *) echo "unknown protocol $proto (json binary grpc stream)" >&2; exit 2 ;;
      esac
      timeout $((warm + window + 60)) taskset -c "$ccpu" "$bench" -m "$model" "${args[@]}" \
        --concurrency-range "$conc" -p $(((warm + window + 20) * 1000)) --max-trials 1 \
        >"$work/bench.log" 2>&1 &
      bpid=$!
      sleep "$warm"
      c0=$(count)
      callgrind_control -z "$spid" >/dev/null 2>&1
      sleep "$window"
      callgrind_control -d "$spid" >/dev/null 2>&1
      c1=$(count)
      kill "$bpid" 2>/dev/null || true; wait "$bpid" 2>/dev/null || true
      kill "$spid" 2>/dev/null || true; wait "$spid" 2>/dev/null || true; spid=
      per_thread "$work" $((c1 - c0)) "$tag round=$round proto=$proto"
      if [ -n "${KEEP:-}" ]; then
        mkdir -p "$KEEP/$tag-$proto-$round"; cp "$work"/cg.* "$KEEP/$tag-$proto-$round/"
      fi
    done
  done
done
