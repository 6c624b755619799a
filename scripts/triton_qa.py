"""Runs a selection of Triton's own QA unit tests (qa/L0_*), unchanged,
against shardserve and (with --triton) the real tritonserver 2.51, and
prints pass/fail per case and totals per server. Started by
scripts/triton_qa.sh, which provides a venv with the tests' imports.

Triton's tests are taken from its server repository at --ref with
`git archive` into a temporary directory (never into this repository).
The model repositories they expect are built here from what runs on both
servers on a CPU machine: Python-backend models only (the real tritonserver
under .backends/python has no other backend), under the names the tests
use. An `onnx_zero_1_float32` here is an identity model of the same
configuration served by the Python backend: the tests check the server's
protocol handling, not the framework.

Cases are named `<suite>:<file>:<Class.test>[<variant>]` so that the two
servers' results line up. Suites and what they need:

  http     L0_http: http_test.py (identity models), python_http_aio_test.py,
           http_restricted_api_test.py (with --http-restricted-api)
  grpc     L0_grpc: python_grpc_aio_test.py, python_unit_test.py
           (RestrictedProtocolTest, with --grpc-restricted-protocol)
  shm      L0_shared_memory: shared_memory_test.py, each case on a fresh
           server, over HTTP and gRPC, as its test.sh does
  batcher  L0_batcher: batcher_test.py with BACKENDS=python (the add/sub
           models test.sh derives from the ONNX ones, configured here)

Not run (their models need TF/TensorRT/PyTorch/ONNX Runtime, which the
real tritonserver here cannot serve, or a GPU): L0_infer/infer_test.py,
L0_sequence_batcher/sequence_batcher_test.py, the C++ client unit tests.
"""

import argparse
import json
import os
import pathlib
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import unittest
import urllib.request

ROOT = pathlib.Path(__file__).resolve().parents[1]
DEFAULT_SOURCE = "/work/.mirror/triton-inference-server+server/repo"
TRITON_DIR = ROOT / ".backends" / "python" / "pytriton" / "tritonserver"
PORTS = (8000, 8001, 8002)

# --------------------------------------------------------------------------
# Models. Our own minimal Python-backend models, configured as the QA
# generators configure the models the tests name.

IDENTITY_PY = '''import json

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    """Returns each INPUTi as OUTPUTi."""

    def initialize(self, args):
        config = json.loads(args["model_config"])
        self.pairs = [(i["name"], o["name"]) for i, o in zip(config["input"], config["output"])]

    def execute(self, requests):
        responses = []
        for request in requests:
            outputs = []
            for src, dst in self.pairs:
                tensor = pb_utils.get_input_tensor_by_name(request, src)
                if tensor is not None:
                    outputs.append(pb_utils.Tensor(dst, tensor.as_numpy()))
            responses.append(pb_utils.InferenceResponse(output_tensors=outputs))
        return responses
'''

ADD_SUB_PY = '''import json
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    """OUTPUT0 = INPUT0 + INPUT1, OUTPUT1 = INPUT0 - INPUT1, after the
    `execute_delay_ms` parameter's sleep (0 when absent)."""

    def initialize(self, args):
        config = json.loads(args["model_config"])
        self.dtypes = [pb_utils.triton_string_to_numpy(o["data_type"]) for o in config["output"]]
        delay = config.get("parameters", {}).get("execute_delay_ms", {}).get("string_value", "0")
        self.delay_s = int(delay) / 1000.0

    def execute(self, requests):
        if self.delay_s:
            time.sleep(self.delay_s)
        responses = []
        for request in requests:
            a = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            b = pb_utils.get_input_tensor_by_name(request, "INPUT1").as_numpy()
            if a.dtype == np.object_ or a.dtype.type is np.bytes_:
                a, b = a.astype(np.int32), b.astype(np.int32)
            sums, diffs = a + b, a - b
            if self.dtypes[0] == np.object_:
                outs = [np.array([str(x).encode() for x in v.flatten()], dtype=np.object_)
                        .reshape(v.shape) for v in (sums, diffs)]
            else:
                outs = [sums.astype(self.dtypes[0]), diffs.astype(self.dtypes[1])]
            responses.append(pb_utils.InferenceResponse(
                [pb_utils.Tensor("OUTPUT0", outs[0]), pb_utils.Tensor("OUTPUT1", outs[1])]))
        return responses
'''

TYPE = {"float32": "TYPE_FP32", "float16": "TYPE_FP16", "object": "TYPE_STRING",
        "int32": "TYPE_INT32", "int8": "TYPE_INT8", "int16": "TYPE_INT16"}


def io_block(kind, entries):
    body = ",\n".join(
        f'  {{ name: "{n}" data_type: {t} dims: [ {", ".join(str(d) for d in dims)} ] }}'
        for n, t, dims in entries)
    return f"{kind} [\n{body}\n]\n"


def write_model(repo, name, model_py, max_batch, inputs, outputs, extra=""):
    d = repo / name
    (d / "1").mkdir(parents=True, exist_ok=True)
    (d / "1" / "model.py").write_text(model_py)
    config = (f'name: "{name}"\nbackend: "python"\nmax_batch_size: {max_batch}\n'
              + io_block("input", inputs) + io_block("output", outputs)
              + "instance_group [ { count: 1, kind: KIND_CPU } ]\n" + extra)
    (d / "config.pbtxt").write_text(config)


def identity_model(repo, name, count, dtype, dims, extra=""):
    write_model(repo, name, IDENTITY_PY, 8,
                [(f"INPUT{i}", TYPE[dtype], dims) for i in range(count)],
                [(f"OUTPUT{i}", TYPE[dtype], dims) for i in range(count)], extra)


def simple_model(repo, name="simple", delay_ms=0, dtype="int32", max_batch=8, extra=""):
    if delay_ms:
        extra += (f'parameters [ {{ key: "execute_delay_ms" '
                  f'value: {{ string_value: "{delay_ms}" }} }} ]\n')
    io = [(f"INPUT{i}", TYPE[dtype], [16]) for i in range(2)]
    out = [(f"OUTPUT{i}", TYPE[dtype], [16]) for i in range(2)]
    write_model(repo, name, ADD_SUB_PY, max_batch, io, out, extra)


def http_models(repo, _qa):
    """qa/L0_http/test.sh's python_unit_test_models (gen_qa_identity_models)."""
    identity_model(repo, "onnx_zero_1_float32", 1, "float32", [-1])
    identity_model(repo, "onnx_zero_1_object", 1, "object", [-1])
    identity_model(repo, "onnx_zero_1_object_1_element", 1, "object", [1])
    identity_model(repo, "onnx_zero_1_float16", 1, "float16", [-1, -1])
    identity_model(repo, "onnx_zero_3_float32", 3, "float32", [-1])
    identity_model(repo, "onnx_zero_1_float32_queue", 1, "float32", [-1], extra=(
        "dynamic_batching {\n  max_queue_delay_microseconds: 1000000\n"
        "  preferred_batch_size: [ 8 ]\n  default_queue_policy { max_queue_size: 1 }\n}\n"))


def simple_models(repo, _qa):
    simple_model(repo)


def delayed_simple_models(repo, _qa):
    """L0_shared_memory's python_models/simple (execute_delayed_model: 15 s)."""
    simple_model(repo, delay_ms=15000)


def batcher_repo(repo, preferred, delay_us, variable):
    """L0_batcher/test.sh with BACKENDS=python: the add/sub model named
    python_float32_float32_float32 (gen_qa_models' ONNX configuration with
    backend python), max_batch_size 8, the given dynamic batching; with
    `variable`, its dims -1 (var_models)."""
    dims = [-1] if variable else [16]
    batching = f"dynamic_batching {{ preferred_batch_size: [ {', '.join(map(str, preferred))} ]"
    if delay_us:
        batching += f", max_queue_delay_microseconds: {delay_us}"
    batching += " }\n"
    io = [(f"INPUT{i}", "TYPE_FP32", dims) for i in range(2)]
    out = [(f"OUTPUT{i}", "TYPE_FP32", dims) for i in range(2)]
    write_model(repo, "python_float32_float32_float32", ADD_SUB_PY, 8, io, out,
                "version_policy: { specific { versions: [1] }}\n" + batching)


def batcher_models(repo, _qa):
    batcher_repo(repo, [2, 6], 10_000_000, variable=False)


def batcher_var_models(repo, _qa):
    batcher_repo(repo, [2, 6], 10_000_000, variable=True)


def batcher_preferred_only_models(repo, _qa):
    batcher_repo(repo, [4, 6], 0, variable=False)


# --------------------------------------------------------------------------
# The selection.

class Run:
    """One server start (or one per case when `fresh`) and the cases of one
    test file run against it."""

    def __init__(self, suite, directory, file, models, cls=None, args=(), env=None,
                 variant="", fresh=False, cases=None, timeout_s=600, server_env=None):
        # server_env: case name -> environment for the server that runs it
        # (Triton's TRITONSERVER_DELAY_SCHEDULER debug setting).
        self.server_env = server_env or (lambda _case: {})
        self.suite, self.directory, self.file = suite, directory, file
        self.models, self.cls, self.args = models, cls, list(args)
        self.env, self.variant, self.fresh = dict(env or {}), variant, fresh
        self.cases, self.timeout_s = cases, timeout_s

    def case_name(self, test_id):
        # test_id: module.Class.test
        short = test_id.split(".", 1)[1]
        suffix = f"[{self.variant}]" if self.variant else ""
        return f"{self.suite}:{self.file}:{short}{suffix}"


def selection():
    runs = [
        Run("http", "L0_http", "http_test.py", http_models, cls="HttpTest"),
        Run("http", "L0_http", "python_http_aio_test.py", simple_models),
        Run("http", "L0_http", "http_restricted_api_test.py", simple_models,
            cls="RestrictedAPITest",
            args=["--http-restricted-api=model-repository:admin-key=admin-value",
                  "--http-restricted-api=inference,metadata:infer-key=infer-value"]),
        Run("grpc", "L0_grpc", "python_grpc_aio_test.py", simple_models),
        Run("grpc", "L0_grpc", "python_unit_test.py", simple_models,
            cls="RestrictedProtocolTest",
            args=["--grpc-restricted-protocol=model-repository:admin-key=admin-value",
                  "--grpc-restricted-protocol=inference,health:infer-key=infer-value"]),
    ]
    for client in ("http", "grpc"):
        runs.append(Run("shm", "L0_shared_memory", "shared_memory_test.py", simple_models,
                        cls="SharedMemoryTest", env={"CLIENT_TYPE": client}, variant=client,
                        fresh=True))
    runs.append(Run("shm", "L0_shared_memory", "shared_memory_test.py", delayed_simple_models,
                    cls="TestSharedMemoryUnregister", fresh=True))
    # L0_batcher/test.sh's groups, each case on a fresh server.
    no_delay = ["test_static_batch_preferred", "test_static_batch_lt_any_preferred",
                "test_static_batch_not_preferred", "test_static_batch_gt_max_preferred",
                "test_multi_batch_not_preferred", "test_multi_batch_gt_max_preferred",
                "test_multi_batch_sum_gt_max_preferred", "test_multi_same_output0",
                "test_multi_same_output1", "test_multi_different_outputs",
                "test_multi_different_output_order"]
    delay = {"test_multi_batch_delayed_sum_gt_max_preferred": 2,
             "test_multi_batch_use_biggest_preferred": 6,
             "test_multi_batch_use_best_preferred": 3,
             "test_multi_batch_delayed_use_max_batch": 3}
    different_shape = ["test_multi_batch_not_preferred_different_shape",
                       "test_multi_batch_preferred_different_shape",
                       "test_multi_batch_different_shape_allow_ragged",
                       "test_multi_batch_different_shape"]
    preferred_only = {"test_preferred_batch_only_aligned": 4,
                      "test_preferred_batch_only_unaligned": 5,
                      "test_preferred_batch_only_use_biggest_preferred": 7,
                      "test_preferred_batch_only_use_no_preferred_size": 3}

    def batcher(models, kind, cases, delays=None):
        delays = delays or {}
        return Run("batcher", "L0_batcher", "batcher_test.py", models, cls="BatcherTest",
                   env={"BACKENDS": "python", "BATCHER_TYPE": kind}, variant=kind.lower(),
                   fresh=True, cases=lambda name: name in cases,
                   server_env=lambda case: ({"TRITONSERVER_DELAY_SCHEDULER": str(delays[case])}
                                            if case in delays else {}))
    for kind, models in (("FIXED", batcher_models), ("VARIABLE", batcher_var_models)):
        runs.append(batcher(models, kind, no_delay))
        runs.append(batcher(models, kind, list(delay), delay))
    runs.append(batcher(batcher_var_models, "VARIABLE", different_shape))
    runs.append(batcher(batcher_var_models, "VARIABLE",
                        ["test_multi_batch_delayed_preferred_different_shape"],
                        {"test_multi_batch_delayed_preferred_different_shape": 4}))
    only = batcher(batcher_preferred_only_models, "FIXED", list(preferred_only), preferred_only)
    only.variant = "preferred_only"
    runs.append(only)
    return runs


# --------------------------------------------------------------------------
# Servers.

def port_busy(port):
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


class Server:
    def __init__(self, kind, binary, repo, args, log_path, backends, env):
        if any(port_busy(p) for p in PORTS):
            raise SystemExit(f"a port of {PORTS} is in use: the QA tests need them free")
        command = [str(binary), f"--model-repository={repo}",
                   f"--http-port={PORTS[0]}", f"--grpc-port={PORTS[1]}",
                   f"--metrics-port={PORTS[2]}", *args]
        if kind == "triton":
            command.append(f"--backend-directory={backends}")
        self.log = open(log_path, "w")
        self.log.write(" ".join(command) + "\n")
        self.log.flush()
        self.proc = subprocess.Popen(command, cwd=ROOT, stdout=self.log,
                                     stderr=subprocess.STDOUT, env={**os.environ, **env})
        self.log_path = log_path

    def wait_ready(self, timeout_s=180):
        deadline = time.time() + timeout_s
        while time.time() < deadline:
            if self.proc.poll() is not None:
                return f"exited with {self.proc.returncode} (see {self.log_path})"
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{PORTS[0]}/v2/health/ready",
                                            timeout=2) as r:
                    if r.status == 200:
                        return None
            except OSError:
                pass
            time.sleep(0.2)
        return f"not ready within {timeout_s} s (see {self.log_path})"

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=40)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()
        # The next start needs the ports: wait until they are released.
        deadline = time.time() + 30
        while any(port_busy(p) for p in PORTS) and time.time() < deadline:
            time.sleep(0.2)


# --------------------------------------------------------------------------
# Running unittest cases in a child (cwd = the test's directory, as
# test.sh runs them, with ../common on the path).

def child_main(argv):
    mode, module = argv[0], argv[1]
    sys.path.insert(0, os.getcwd())
    sys.path.insert(0, os.path.abspath("../common"))
    if mode == "list":
        suite = unittest.defaultTestLoader.loadTestsFromName(module)
        ids = []

        def walk(s):
            for t in s:
                if isinstance(t, unittest.TestSuite):
                    walk(t)
                else:
                    ids.append(t.id())
        walk(suite)
        print(json.dumps(ids))
        return 0
    out_path, names = argv[2], argv[3:]
    suite = unittest.defaultTestLoader.loadTestsFromNames(names)
    result = unittest.TextTestResult(unittest.runner._WritelnDecorator(sys.stderr),
                                     descriptions=False, verbosity=2)
    suite.run(result)
    status = {}
    for name in names:
        status[name] = ["pass", ""]

    def record(test, kind, text):
        # A subtest's failure fails its test.
        tid = test.test_case.id() if hasattr(test, "test_case") else test.id()
        last = text.strip().splitlines()[-1] if text.strip() else ""
        if tid in status and status[tid][0] == "pass":
            status[tid] = [kind, last[:300]]
        elif tid not in status:
            # setUpClass and friends: charge every case.
            for k in status:
                if status[k][0] == "pass":
                    status[k] = [kind, f"{tid}: {last[:300]}"]
    for test, text in result.failures:
        record(test, "fail", text)
    for test, text in result.errors:
        record(test, "error", text)
    for test, reason in result.skipped:
        record(test, "skip", reason)
    for test, text in result.unexpectedSuccesses if hasattr(result, "unexpectedSuccesses") else []:
        record(test, "fail", "unexpected success")
    pathlib.Path(out_path).write_text(json.dumps(status))
    return 0


def run_child(qa, run, names, env, log, timeout_s):
    cwd = qa / "qa" / run.directory
    module = run.file[:-3]
    out = tempfile.NamedTemporaryFile(suffix=".json", delete=False)
    out.close()
    command = [sys.executable, str(pathlib.Path(__file__).resolve()), "--child", "run",
               module, out.name, *names]
    try:
        subprocess.run(command, cwd=cwd, env=env, stdout=log, stderr=subprocess.STDOUT,
                       timeout=timeout_s, check=False)
        text = pathlib.Path(out.name).read_text()
        return json.loads(text) if text else {n: ["error", "the runner child died"] for n in names}
    except subprocess.TimeoutExpired:
        return {n: ["error", f"timed out after {timeout_s} s"] for n in names}
    finally:
        os.unlink(out.name)


def list_cases(qa, run, env):
    cwd = qa / "qa" / run.directory
    module = run.file[:-3] + (f".{run.cls}" if run.cls else "")
    r = subprocess.run([sys.executable, str(pathlib.Path(__file__).resolve()), "--child",
                        "list", module], cwd=cwd, env=env, capture_output=True, text=True,
                       check=False)
    if r.returncode != 0:
        raise SystemExit(f"cannot list {run.file}: {r.stderr[-2000:]}")
    ids = json.loads(r.stdout.strip().splitlines()[-1])
    if run.cases:
        ids = [i for i in ids if run.cases(i.rsplit(".", 1)[1])]
    return ids


# --------------------------------------------------------------------------

def extract(source, ref, dest):
    paths = ["qa/common", "qa/python_models/add_sub"] + sorted(
        {f"qa/{r.directory}" for r in selection()})
    git = ["git", "-C", source]
    archive = subprocess.run(git + ["archive", ref, *paths], capture_output=True, check=False)
    if archive.returncode != 0:
        raise SystemExit(f"git archive {ref} failed in {source}: "
                         f"{archive.stderr.decode(errors='replace')}")
    subprocess.run(["tar", "-x", "-C", str(dest)], input=archive.stdout, check=True)


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        return child_main(sys.argv[2:])
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--source", default=DEFAULT_SOURCE,
                   help="Triton server repository (checkout or bare mirror)")
    p.add_argument("--ref", default="v2.51.0", help="the QA tests' revision (default v2.51.0)")
    p.add_argument("--suites", default="http,grpc,shm,batcher",
                   help="comma-separated: http, grpc, shm, batcher")
    p.add_argument("--cases", default="", help="only cases whose name matches this regex")
    p.add_argument("--triton", action="store_true",
                   help="also run the real tritonserver 2.51 (.backends/python/pytriton)")
    p.add_argument("--no-shardserve", action="store_true", help="run only tritonserver")
    p.add_argument("--shardserve", default=str(ROOT / "target" / "release" / "shardserve"),
                   help="the shardserve binary")
    p.add_argument("--server-arg", action="append", default=[],
                   help="an extra shardserve argument (repeatable)")
    p.add_argument("--workdir", default="", help="where tests, models and logs go")
    p.add_argument("--list", action="store_true", help="print the selected cases and stop")
    p.add_argument("--json", default="", help="write the results to this file")
    opts = p.parse_args()

    suites = set(opts.suites.split(","))
    unknown = suites - {"http", "grpc", "shm", "batcher"}
    if unknown:
        raise SystemExit(f"unknown suites: {sorted(unknown)}")
    work = pathlib.Path(opts.workdir or tempfile.mkdtemp(prefix="triton-qa-"))
    work.mkdir(parents=True, exist_ok=True)
    qa = work / "triton"
    if qa.exists():
        shutil.rmtree(qa)
    qa.mkdir()
    extract(opts.source, opts.ref, qa)
    (work / "logs").mkdir(exist_ok=True)
    backends = work / "backends"
    backends.mkdir(exist_ok=True)
    link = backends / "python"
    if not link.exists():
        # Triton looks for the stub and numpy beside libtriton_python.so.
        link.symlink_to((ROOT / ".backends" / "python").resolve())

    servers = []
    if not opts.no_shardserve:
        servers.append(("shardserve", pathlib.Path(opts.shardserve)))
    if opts.triton:
        servers.append(("triton", TRITON_DIR / "bin" / "tritonserver"))
    base_env = dict(os.environ)
    pattern = re.compile(opts.cases) if opts.cases else None

    plan = []
    for run in selection():
        if run.suite not in suites:
            continue
        env = {**base_env, **run.env}
        ids = [i for i in list_cases(qa, run, env)
               if not pattern or pattern.search(run.case_name(i))]
        if ids:
            plan.append((run, env, ids))
    if opts.list:
        for run, _, ids in plan:
            for i in ids:
                print(run.case_name(i))
        print(f"{sum(len(i) for _, _, i in plan)} cases")
        return 0

    results = {}
    for server_name, binary in servers:
        if not binary.exists():
            raise SystemExit(f"{binary} is missing")
        args = opts.server_arg if server_name == "shardserve" else []
        for n, (run, env, ids) in enumerate(plan):
            repo = work / "models" / f"{run.file[:-3]}-{n}"
            if repo.exists():
                shutil.rmtree(repo)
            repo.mkdir(parents=True)
            run.models(repo, qa)
            groups = [[i] for i in ids] if run.fresh else [ids]
            for group in groups:
                tag = f"{server_name}-{run.file[:-3]}-{n}{run.variant}" + (
                    f"-{group[0].rsplit('.', 1)[1]}" if run.fresh else "")
                server_env = run.server_env(group[0].rsplit(".", 1)[1]) if run.fresh else {}
                server = Server(server_name, binary, repo, run.args + args,
                                work / "logs" / f"{tag}.server.log", backends, server_env)
                try:
                    failed = server.wait_ready()
                    if failed:
                        status = {i: ["error", f"server {failed}"] for i in group}
                    else:
                        with open(work / "logs" / f"{tag}.client.log", "w") as log:
                            status = run_child(qa, run, group, env, log, run.timeout_s)
                finally:
                    server.stop()
                for i in group:
                    kind, why = status.get(i, ["error", "no result"])
                    name = run.case_name(i)
                    results.setdefault(name, {})[server_name] = [kind, why]
                    line = f"{kind.upper():5} {server_name:10} {name}"
                    print(line + (f"  -- {why}" if kind != "pass" and why else ""), flush=True)

    names = [s for s, _ in servers]
    print("\n" + " ".join(f"{s:>10}" for s in names) + "  case")
    for case in sorted(results):
        print(" ".join(f"{results[case].get(s, ['-'])[0]:>10}" for s in names) + f"  {case}")
    print()
    for s in names:
        passed = sum(1 for c in results.values() if c.get(s, [""])[0] == "pass")
        print(f"{s}: {passed} of {len(results)} passed")
    if len(names) == 2:
        only = [c for c, r in results.items()
                if r.get(names[1], [""])[0] == "pass" and r.get(names[0], [""])[0] != "pass"]
        print(f"passed by {names[1]}, not by {names[0]}: {len(only)}")
        for c in sorted(only):
            print(f"  {c}: {results[c][names[0]][1]}")
    print(f"logs: {work / 'logs'}")
    if opts.json:
        pathlib.Path(opts.json).write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
