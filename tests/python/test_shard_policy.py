"""Shard threads run as SCHED_BATCH by default (so their wake-ups do not
preempt a compute worker sharing their core) and as SCHED_OTHER when a
profile sets `[runtime] sched_batch = false`; compute workers keep the
ordinary policy either way. Read from the running server's /proc/PID/task/*/stat
(field 41, the policy)."""

import pathlib
import shutil

from serverproc import ROOT, ServerProcess

SCHED_OTHER, SCHED_BATCH = 0, 3


def policies(pid):
    """Thread name -> scheduling policy of every thread of `pid`."""
    out = {}
    for task in pathlib.Path(f"/proc/{pid}/task").iterdir():
        try:
            stat = (task / "stat").read_text()
        except OSError:
            continue
        name = stat[stat.index("(") + 1:stat.rindex(")")]
        fields = stat[stat.rindex(")") + 2:].split()
        # Field 41 of stat, counted from 1; `fields` starts at field 3.
        out.setdefault(name, set()).add(int(fields[41 - 3]))
    return out


def run(args, tmp_path):
    repo = tmp_path / "repo"
    repo.mkdir(exist_ok=True)
    for model in ("simple", "mlp_onnx"):
        dst = repo / model
        if not dst.exists():
            shutil.copytree(ROOT / "models" / model, dst)
    server = ServerProcess([repo], args, log=None, cores=2)
    try:
        return policies(server.proc.pid)
    finally:
        server.stop_expecting_success()


def test_shards_are_sched_batch_by_default_and_workers_not(tmp_path):
    seen = run([], tmp_path)
    shards = {n: p for n, p in seen.items() if n.startswith("shard-")}
    assert shards, seen
    assert all(p == {SCHED_BATCH} for p in shards.values()), seen
    workers = {n: p for n, p in seen.items() if n.startswith("compute-")}
    assert workers, f"mlp_onnx should have a compute worker: {seen}"
    assert all(p == {SCHED_OTHER} for p in workers.values()), seen


def test_the_preempting_profile_keeps_shards_sched_other(tmp_path):
    profile = ROOT / "tuning" / "preempting-shards.toml"
    seen = run(["--tuning-profile", str(profile)], tmp_path)
    shards = {n: p for n, p in seen.items() if n.startswith("shard-")}
    assert shards and all(p == {SCHED_OTHER} for p in shards.values()), seen
