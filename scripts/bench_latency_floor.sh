#!/usr/bin/env bash
# Concurrency-1 latency against the loopback floor (issue 26), A/B in one
# run: two server binaries (and optionally two shardserve-bench binaries,
# each paired with its server) alternated for ROUNDS rounds, `simple` over
# HTTP JSON, HTTP binary and gRPC at concurrency 1; server on SERVER_CPU
# with one shard, generator on CLIENT_CPU. Then the loopback floor with
# sockperf (if installed): TCP ping-pong between the same CPUs, blocking and
# non-blocking (busy-polling) sockets. Then the CPU a server burns while
# idle: 10 s with no traffic right after a c=1 run, B with its default
# spin window and with --spin-us 0 (CPU time from /proc/PID/task/*/schedstat).
# Loopback only, bounded in time (every step under `timeout`). Prints one
# line per figure, then the medians and ratios.
#
# Usage: scripts/bench_latency_floor.sh BASE_BIN NEW_BIN [BASE_BENCH NEW_BENCH]
#   env: SECONDS_PER=3 ROUNDS=3 SERVER_CPU=0 CLIENT_CPU=1 PORT=19400 IDLE_SECS=10
#        NEW_ARGS="" (extra flags for NEW_BIN, e.g. "--spin-us 500")
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/lib.sh
source scripts/lib.sh
base=$1; new=$2
base_bench=${3:-target/release/shardserve-bench}
new_bench=${4:-$base_bench}
secs=${SECONDS_PER:-3}
rounds=${ROUNDS:-3}
scpu=${SERVER_CPU:-0}
ccpu=${CLIENT_CPU:-1}
port=${PORT:-19400}
idle=${IDLE_SECS:-10}
new_args=${NEW_ARGS:-}
out=$(mktemp -d)
pid=
trap '[ -n "$pid" ] && kill "$pid" 2>/dev/null; rm -rf "$out"' EXIT

start_server() { # BIN EXTRA_ARGS...
  local bin=$1; shift
  port=$((port + 3))
  taskset -c "$scpu" "$bin" --model-repository models --host 127.0.0.1 \
    --http-port "$port" --grpc-port $((port + 1)) --metrics-port $((port + 2)) \
    --model-control-mode explicit --load-model simple --cores 1 "$@" >"$out/server.log" 2>&1 &
  pid=$!
  ss_wait_ready "$port" && return 0
  echo "server $bin did not become ready" >&2
  cat "$out/server.log" >&2
  return 1
}
stop_server() {
  kill -TERM "$pid" 2>/dev/null || true
  wait "$pid" 2>/dev/null || true
  pid=
}
cpu_ns() { # total CPU time of every thread of $pid, in ns
  cat /proc/"$pid"/task/*/schedstat 2>/dev/null | awk '{s += $1} END {printf "%d", s}'
}
# One c=1 measurement: prints "p50 p99 infer/s" (µs) or "fail".
c1() { # BENCH PROTO(http-json|http-binary|grpc)
  local bench=$1 proto=$2 args
  case $proto in
    http-json) args=(-i http -u "127.0.0.1:$port" --input-tensor-format json --output-tensor-format json) ;;
    http-binary) args=(-i http -u "127.0.0.1:$port") ;;
    grpc) args=(-i grpc -u "127.0.0.1:$((port + 1))") ;;
  esac
  if timeout $((secs * 6 + 30)) taskset -c "$ccpu" "$bench" -m simple "${args[@]}" \
    --concurrency-range 1 --cpu "$ccpu" -p $((secs * 1000)) --max-trials 3 \
    >"$out/bench.txt" 2>&1; then
    awk '$1 == "1" && NF >= 7 {print $4, $7, $2; found=1} END {if (!found) print "fail"}' "$out/bench.txt" | tail -1
  else
    echo fail
  fi
}

for r in $(seq 1 "$rounds"); do
  for which in A B; do
    if [ $which = A ]; then bin=$base; bench=$base_bench; extra=(); else bin=$new; bench=$new_bench; read -ra extra <<<"$new_args"; fi
    start_server "$bin" "${extra[@]}"
    for proto in http-json http-binary grpc; do
      read -r p50 p99 rps _ <<<"$(c1 "$bench" "$proto") - - -"
      echo "c1 $which round=$r proto=$proto p50_us=$p50 p99_us=$p99 infer_s=$rps" | tee -a "$out/all.txt"
    done
    stop_server
  done
done

floor=
if command -v sockperf >/dev/null; then
  for mode in blocking nonblocked; do
    flags=(); [ $mode = nonblocked ] && flags=(--nonblocked)
    port=$((port + 3))
    taskset -c "$scpu" sockperf server --tcp "${flags[@]}" -i 127.0.0.1 -p "$port" >"$out/sp.log" 2>&1 &
    sp=$!
    sleep 1
    timeout $((secs * 2 + 20)) taskset -c "$ccpu" sockperf ping-pong --tcp "${flags[@]}" --full-rtt \
      -i 127.0.0.1 -p "$port" -t "$secs" -m 64 >"$out/spc.log" 2>&1 || true
    kill "$sp" 2>/dev/null || true; wait "$sp" 2>/dev/null || true
    p50=$(sed 's/\x1b\[[0-9;]*m//g' "$out/spc.log" | awk '/percentile 50.000/ {print $NF}')
    p99=$(sed 's/\x1b\[[0-9;]*m//g' "$out/spc.log" | awk '/percentile 99.000/ {print $NF}')
    echo "floor sockperf-tcp-$mode rtt_p50_us=${p50:-fail} rtt_p99_us=${p99:-fail}"
    [ $mode = blocking ] && floor=${p50:-}
  done
else
  echo "floor sockperf not installed (apt-get install sockperf): no loopback floor"
fi

# Where the time goes: context switches and syscalls per request on the
# server at c=1 (HTTP binary), A and B, with perf if installed.
count() { curl -s "http://127.0.0.1:$port/v2/models/simple/stats" |
  python3 -c "import sys, json; print(json.load(sys.stdin)['model_stats'][0]['inference_count'])"; }
if command -v perf >/dev/null; then
  for which in A B; do
    if [ $which = A ]; then bin=$base; bench=$base_bench; extra=(); else bin=$new; bench=$new_bench; read -ra extra <<<"$new_args"; fi
    start_server "$bin" "${extra[@]}"
    timeout $((secs * 6 + 30)) taskset -c "$ccpu" "$bench" -m simple -i http -u "127.0.0.1:$port" \
      --concurrency-range 1 --cpu "$ccpu" -p $(((secs + 2) * 1000)) --max-trials 1 >/dev/null 2>&1 &
    gen=$!
    sleep 1
    before=$(count)
    perf stat -x, -e context-switches,raw_syscalls:sys_enter,task-clock -p "$pid" -- sleep "$secs" 2>"$out/perf.txt" || true
    after=$(count)
    wait "$gen" 2>/dev/null || true
    n=$((after - before))
    awk -F, -v n="$n" -v w="$which" '
      $3 == "context-switches" {cs = $1} $3 == "raw_syscalls:sys_enter" {sc = $1} $3 == "task-clock" {tc = $1}
      END { if (n > 0) printf "per-request %s requests=%d context_switches=%.2f syscalls=%.2f cpu_us=%.1f\n", w, n, cs / n, sc / n, tc * 1000 / n;
            else print "per-request " w " no requests counted" }' "$out/perf.txt"
    stop_server
  done
fi

# Idle CPU: one c=1 run to arm the spinner, then IDLE_SECS with no traffic.
for variant in default off; do
  extra=(); [ $variant = off ] && extra=(--spin-us 0)
  read -ra more <<<"$new_args"
  [ $variant = default ] && extra=("${more[@]}")
  start_server "$new" "${extra[@]}"
  c1 "$new_bench" http-binary >/dev/null
  before=$(cpu_ns); sleep "$idle"; after=$(cpu_ns)
  echo "idle B spin=$variant cpu_ms_in_${idle}s=$(( (after - before) / 1000000 ))"
  stop_server
done

# Medians and ratios.
for proto in http-json http-binary grpc; do
  awk -v p="proto=$proto" -v floor="$floor" '$4 == p {
      split($5, a, "="); split($6, b, "=");
      if (a[2] != "fail" && a[2] != "-") { v[$2, ++n[$2]] = a[2]; w[$2, n[$2]] = b[2] } }
    function med(k, arr,   i, j, t, m, x) {
      m = n[k]; if (m == 0) return -1
      for (i = 1; i <= m; i++) x[i] = arr[k, i]
      for (i = 1; i <= m; i++) for (j = i + 1; j <= m; j++) if (x[j] + 0 < x[i] + 0) { t = x[i]; x[i] = x[j]; x[j] = t }
      return x[int((m + 1) / 2)]
    }
    END {
      a50 = med("A", v); b50 = med("B", v); a99 = med("A", w); b99 = med("B", w)
      printf "median %s: A p50 %s us p99 %s us; B p50 %s us p99 %s us; B/A p50 %.3f", substr(p, 7), a50, a99, b50, b99, (a50 > 0 ? b50 / a50 : 0)
      if (floor != "") printf "; B p50 / sockperf floor %.2f; A %.2f", b50 / floor, a50 / floor
      printf "\n"
    }' "$out/all.txt"
done
