#!/usr/bin/env bash
# What a shard does between a request's read and its answer's write at
# concurrency 1 (issue 26): `simple` on a one-shard server (SERVER_CPU),
# shardserve-bench at c=1 (CLIENT_CPU), `perf record` of every syscall
# entry and exit of the shard thread for 0.2 s; each answer is grouped by
# the syscalls between the successful read that brought its request and
# its `writev` (e.g. "recvEAGAIN epoll_wait(0)"), with the share of
# answers and the p50 read-to-write time per group. perf's tracing slows
# each syscall, so the times are inflated; the grouping is the point.
# Loopback only, bounded in time.
#
# Usage: scripts/c1_syscalls.sh BIN PROTO(http|grpc) [server flags...]
#   e.g. scripts/c1_syscalls.sh target/release/shardserve grpc --spin-us 250
#   env: SERVER_CPU=0 CLIENT_CPU=1 PORT=18800
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/lib.sh
source scripts/lib.sh
[ $# -ge 2 ] || { sed -n '2,15p' "$0" >&2; exit 2; }
bin=$1 proto=$2
shift 2
scpu=${SERVER_CPU:-0}
ccpu=${CLIENT_CPU:-1}
port=${PORT:-18800}
command -v perf >/dev/null || { echo "perf is required" >&2; exit 1; }
work=$(mktemp -d)
spid=
trap '[ -n "$spid" ] && kill "$spid" 2>/dev/null; rm -rf "$work"' EXIT
mkdir "$work/repo"
cp -r models/simple "$work/repo/"
taskset -c "$scpu" "$bin" --model-repository "$work/repo" --host 127.0.0.1 --http-port $port \
  --grpc-port $((port + 1)) --metrics-port $((port + 2)) --cores 1 "$@" >"$work/server.log" 2>&1 &
spid=$!
ss_wait_ready $port || { tail -n 5 "$work/server.log"; exit 1; }
tid=$(ss_thread_id $spid shard-0)
target=$port
[ "$proto" = grpc ] && target=$((port + 1))
timeout 60 taskset -c "$ccpu" target/release/shardserve-bench -m simple -u 127.0.0.1:$target \
  -i "$proto" -p 3000 --max-trials 1 --no-progress >"$work/bench.txt" 2>&1 &
bpid=$!
sleep 1
timeout 20 perf record -t "$tid" -e 'raw_syscalls:sys_enter' -e 'raw_syscalls:sys_exit' \
  -o "$work/perf.data" -- sleep 0.2 >/dev/null 2>&1
wait $bpid || true
echo "$(basename "$bin") $proto $(grep -A1 Concurrency "$work/bench.txt" | tail -n 1 | awk '{print "p50_us", $4}')"
perf script -i "$work/perf.data" -F time,event,trace 2>/dev/null | python3 -c '
import collections, re, statistics, sys
names = {45: "recv", 20: "writev", 232: "epoll_wait", 24: "sched_yield", 7: "poll",
         426: "io_uring_enter", 17: "pread", 0: "read", 1: "write", 46: "sendmsg", 202: "futex"}
events = []
for line in sys.stdin:
    m = re.match(r"\s*([\d.]+):\s+raw_syscalls:sys_(enter|exit): NR (\d+)(.*)", line)
    if not m:
        continue
    t, kind, nr, rest = float(m.group(1)), m.group(2), int(m.group(3)), m.group(4)
    if kind == "enter":
        events.append([t, names.get(nr, str(nr)), rest.strip(" ()").split(", "), None])
    elif events and events[-1][3] is None:
        events[-1][3] = int(rest.split("=")[1])
groups, open_at = collections.defaultdict(list), None
for t, name, args, ret in events:
    tag = name
    if name == "recv":
        tag = "recv" if (ret or 0) > 0 else "recvEAGAIN"
    if name == "epoll_wait":
        tag = "epoll_wait(0)" if len(args) > 3 and args[3] == "0" else "epoll_wait(block)"
    if tag == "recv" and open_at is None:
        open_at = (t, [])
    elif name == "writev" and open_at is not None:
        groups[" ".join(open_at[1]) or "-"].append((t - open_at[0]) * 1e6)
        open_at = None
    elif open_at is not None:
        open_at[1].append(tag)
total = sum(len(v) for v in groups.values()) or 1
for key, v in sorted(groups.items(), key=lambda kv: -len(kv[1]))[:6]:
    print(f"  {len(v) / total * 100:4.0f}% read->write p50 {statistics.median(v):5.1f} us  between: {key}")
print(f"  {total} answers")
'
