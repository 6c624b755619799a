# Helpers shared by the bench and device scripts: `source scripts/lib.sh`.
# Nothing here runs on its own.

# ss_export_ort_lib: points SHARDSERVE_ORT_LIB at the .venv's ONNX Runtime
# when it is unset, so binaries copied out of target/release load ONNX models.
ss_export_ort_lib() {
  [ -n "${SHARDSERVE_ORT_LIB:-}" ] && return 0
  local lib
  lib=$(ls .venv/lib/python3*/site-packages/onnxruntime/capi/libonnxruntime.so.* 2>/dev/null | head -n 1 || true)
  if [ -n "$lib" ]; then
    SHARDSERVE_ORT_LIB=$PWD/$lib
    export SHARDSERVE_ORT_LIB
  fi
}

# ss_wait_ready PORT [TRIES=300]: polls /v2/health/ready on 127.0.0.1:PORT
# every 0.1 s; status 1 once TRIES polls have failed.
ss_wait_ready() {
  local port=$1 tries=${2:-300}
  for _ in $(seq 1 "$tries"); do
    curl -sf "http://127.0.0.1:$port/v2/health/ready" >/dev/null 2>&1 && return 0
    sleep 0.1
  done
  return 1
}

# ss_thread_stat PID: "compute_user compute_sys shard_user shard_sys
# switches" over PID's threads: CPU ticks (in CLK_TCK) of the compute-* and
# the shard-* threads, user and system time apart (a shard's system time is
# its socket reads and writes and their loopback delivery, which no
# user-space saving removes), and the voluntary plus involuntary context
# switches of all of them.
ss_thread_stat() {
  python3 - "$1" <<'PY'
import glob, sys
cu = cs = su = ss = sw = 0
for d in glob.glob(f"/proc/{sys.argv[1]}/task/*"):
    try:
        data = open(d + "/stat").read()
        status = open(d + "/status").read()
    except OSError:
        continue
    comm = data[data.index("(") + 1:data.rindex(")")]
    fields = data[data.rindex(")") + 2:].split()
    user, system = int(fields[11]), int(fields[12])
    if comm.startswith("compute-"):
        cu += user
        cs += system
    elif comm.startswith("shard-"):
        su += user
        ss += system
    for line in status.splitlines():
        if line.startswith(("voluntary_ctxt_switches", "nonvoluntary_ctxt_switches")):
            sw += int(line.split()[1])
print(cu, cs, su, ss, sw)
PY
}

# ss_thread_counters PID: "compute_ticks shard_ticks switches": ss_thread_stat
# with user and system time added up.
ss_thread_counters() {
  ss_thread_stat "$1" | awk '{ print $1 + $2, $3 + $4, $5 }'
}

# ss_thread_id PID NAME: the thread id of PID's thread named NAME
# (e.g. shard-0); empty if there is none.
ss_thread_id() {
  local t
  for t in /proc/"$1"/task/*; do
    [ "$(cat "$t/comm" 2>/dev/null)" = "$2" ] && { basename "$t"; return 0; }
  done
  return 0
}

# ss_shard_ticks PID: one "thread-name ticks" line per shard-* thread of
# PID (utime+stime in CLK_TCK), for per-shard busy shares around a run.
ss_shard_ticks() {
  local t
  for t in /proc/"$1"/task/*; do
    awk '{ c = $0; sub(/^[^(]*\(/, "", c); name = c; sub(/\).*/, "", name);
           sub(/^[^)]*\) /, "", c); split(c, f, " ");
           if (name ~ /^shard-/) print name, f[12] + f[13] }' "$t/stat" 2>/dev/null
  done
}

# ss_shard_busy BEFORE AFTER START: each shard's busy share of its core
# between two ss_shard_ticks snapshots, the first taken at START (epoch
# seconds, `date +%s.%N`) and the second just now; busiest first.
ss_shard_busy() {
  python3 - "$1" "$2" "$3" "$(getconf CLK_TCK)" <<'PY'
import sys, time
before, after, hz = sys.argv[1], sys.argv[2], int(sys.argv[4])
secs = max(time.time() - float(sys.argv[3]), 1e-3)
parse = lambda s: {l.split()[0]: int(l.split()[1]) for l in s.splitlines() if l.strip()}
b, a = parse(before), parse(after)
busy = sorted(((a[k] - b.get(k, 0)) / hz / secs * 100, k) for k in a)[::-1]
print("shard busy %: " + " ".join(f"{k}={v:.0f}" for v, k in busy))
PY
}
