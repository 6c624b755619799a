"""The rate limiter (`--rate-limit execution_count`, `--rate-limit-resource`)
through tritonclient, over HTTP and gRPC.

Two Python-backend models, `rl_a` and `rl_b`, one instance each, both asking
for resource R (count 1). An execution marks itself running in a file, then
waits (up to WAIT_MS) for its partner to be running, and answers OVERLAP=1 if
it saw the partner running (then it stays running until the partner saw it
too, so both see each other). That makes overlap a rendezvous rather than
a timing guess: with R:1 neither may ever see the other (each waits its full
WAIT_MS alone); with R:2, or the limiter off, both meet and answer at once.

Bad input: a model asking for more than `--rate-limit-resource` provides is
refused with Triton's text; a malformed `--rate-limit-resource` exits 1."""

import shutil
import subprocess
import textwrap
import threading
import time

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from serverproc import BINARY, ROOT, ServerProcess, free_port

BACKEND = ROOT / ".backends" / "python" / "libtriton_python.so"

MODEL_PY = textwrap.dedent('''
    import json
    import os
    import time

    import numpy as np
    import triton_python_backend_utils as pb_utils


    class TritonPythonModel:
        def initialize(self, args):
            config = json.loads(args["model_config"])
            self.name = config["name"]
            self.partner = config["parameters"]["partner"]["string_value"]
            # <repository>/<model>/1/model.py: markers go in the repository.
            self.dir = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

        def execute(self, requests):
            def path(name, kind):
                return os.path.join(self.dir, name + "." + kind)

            def wait_for(name, deadline):
                while not os.path.exists(name):
                    if time.monotonic() >= deadline:
                        return False
                    time.sleep(0.005)
                return True

            if os.path.exists(path(self.name, "saw")):
                os.remove(path(self.name, "saw"))
            open(path(self.name, "running"), "w").close()
            responses = []
            try:
                for request in requests:
                    wait_ms = int(pb_utils.get_input_tensor_by_name(request, "WAIT_MS")
                                  .as_numpy().reshape(-1)[0])
                    deadline = time.monotonic() + wait_ms / 1000.0
                    seen = wait_for(path(self.partner, "running"), deadline)
                    if seen:
                        # Stay running until the partner has seen this one too.
                        open(path(self.name, "saw"), "w").close()
                        wait_for(path(self.partner, "saw"), deadline)
                    out = pb_utils.Tensor("OVERLAP", np.array([1 if seen else 0], dtype=np.int32))
                    responses.append(pb_utils.InferenceResponse(output_tensors=[out]))
            finally:
                os.remove(path(self.name, "running"))
            return responses
''')


def config(name, partner, count=1, backend="python"):
    return textwrap.dedent(f'''
        name: "{name}"
        backend: "{backend}"
        max_batch_size: 0
        input [ {{ name: "WAIT_MS" data_type: TYPE_INT32 dims: [ 1 ] }} ]
        output [ {{ name: "OVERLAP" data_type: TYPE_INT32 dims: [ 1 ] }} ]
        instance_group [ {{
          count: 1
          kind: KIND_CPU
          rate_limiter {{ resources [ {{ name: "R" count: {count} }} ] }}
        }} ]
        parameters {{ key: "partner" value: {{ string_value: "{partner}" }} }}
    ''')


def python_repo(path):
    for name, partner in (("rl_a", "rl_b"), ("rl_b", "rl_a")):
        (path / name / "1").mkdir(parents=True)
        (path / name / "config.pbtxt").write_text(config(name, partner))
        (path / name / "1" / "model.py").write_text(MODEL_PY)
    return path


def infer(protocol, url, model, wait_ms):
    mod = httpclient if protocol == "http" else grpcclient
    client = mod.InferenceServerClient(url) if protocol == "grpc" else \
        httpclient.InferenceServerClient(url, network_timeout=120, connection_timeout=120)
    inp = mod.InferInput("WAIT_MS", [1], "INT32")
    inp.set_data_from_numpy(np.array([wait_ms], dtype=np.int32))
    if protocol == "grpc":
        result = client.infer(model, [inp], client_timeout=120)
    else:
        result = client.infer(model, [inp])
    return int(result.as_numpy("OVERLAP")[0])


def overlaps(server, wait_ms):
    """rl_a over HTTP and rl_b over gRPC at once, then the other way round:
    each pair's OVERLAP answers."""
    out = []
    for protocols in (("http", "grpc"), ("grpc", "http")):
        results, errors = {}, []

        def run(model, protocol):
            url = server.http_url if protocol == "http" else server.grpc_url
            try:
                results[model] = infer(protocol, url, model, wait_ms)
            except Exception as e:  # reported below, with the model's name
                errors.append(f"{model} over {protocol}: {e}")

        threads = [threading.Thread(target=run, args=(m, p))
                   for m, p in zip(("rl_a", "rl_b"), protocols)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=180)
        assert not errors, errors
        out.append((results["rl_a"], results["rl_b"]))
    return out


def start(tmp_path, args, log):
    if not BACKEND.exists():
        pytest.skip(f"Triton's Python backend is not installed ({BACKEND})")
    repo = python_repo(tmp_path / "repo")
    return ServerProcess([repo], args, log=log, ready_timeout_s=120)


def test_one_unit_never_lets_two_models_execute_together(tmp_path):
    server = start(tmp_path, ["--rate-limit", "execution_count", "--rate-limit-resource", "R:1"],
                   "rate-limiter-r1.log")
    try:
        # Each waits 1.5 s for a partner that the limiter must keep out.
        assert overlaps(server, 1500) == [(0, 0), (0, 0)]
    finally:
        server.stop_expecting_success()


def test_default_count_is_the_largest_need(tmp_path):
    # No --rate-limit-resource: R counts 1, the most any instance asks for.
    server = start(tmp_path, ["--rate-limit=execution_count"], "rate-limiter-default.log")
    try:
        assert overlaps(server, 1500) == [(0, 0), (0, 0)]
    finally:
        server.stop_expecting_success()


def test_two_units_let_both_models_execute_together(tmp_path):
    server = start(tmp_path, ["--rate-limit", "execution_count", "--rate-limit-resource", "R:2:0"],
                   "rate-limiter-r2.log")
    try:
        # The partner shows up as soon as it runs; 60 s is only a bound.
        assert overlaps(server, 60000) == [(1, 1), (1, 1)]
    finally:
        server.stop_expecting_success()


def test_limiter_off_ignores_the_config(tmp_path):
    server = start(tmp_path, ["--rate-limit=off", "--rate-limit-resource=R:1"],
                   "rate-limiter-off.log")
    try:
        assert overlaps(server, 60000) == [(1, 1), (1, 1)]
    finally:
        server.stop_expecting_success()


TRITON_TEXT = ('Resource count for "R" is limited to 1 which will prevent scheduling of one '
               'or more model instances, the minimum required count is 2')


def identity_repo(path):
    """A built-in model needing 2 of R, and `simple` (no resources)."""
    (path / "needs_two" / "1").mkdir(parents=True)
    (path / "needs_two" / "config.pbtxt").write_text(
        config("needs_two", "none", count=2, backend="identity")
        .replace('"WAIT_MS"', '"INPUT0"').replace('"OVERLAP"', '"OUTPUT0"'))
    shutil.copytree(ROOT / "models" / "simple", path / "simple")
    return path


def test_a_model_needing_more_than_given_is_refused_with_tritons_text(tmp_path):
    repo = identity_repo(tmp_path / "repo")
    server = ServerProcess([repo], ["--rate-limit=execution_count", "--rate-limit-resource=R:1",
                                    "--exit-on-error=false", "--strict-readiness=false"],
                           log="rate-limiter-refused.log", ready_path="/v2/health/live")
    try:
        http = httpclient.InferenceServerClient(server.http_url)
        grpc = grpcclient.InferenceServerClient(server.grpc_url)
        deadline = time.monotonic() + 60
        while True:
            rows = {m["name"]: m for m in http.get_model_repository_index()}
            if rows["needs_two"].get("state") != "LOADING" or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        assert rows["needs_two"]["state"] == "UNAVAILABLE", rows
        assert TRITON_TEXT in rows["needs_two"]["reason"], rows
        grpc_rows = {m.name: m for m in grpc.get_model_repository_index().models}
        assert grpc_rows["needs_two"].state == "UNAVAILABLE"
        assert TRITON_TEXT in grpc_rows["needs_two"].reason
        # The rest of the repository serves.
        assert http.is_model_ready("simple") and grpc.is_model_ready("simple")
        assert not http.is_model_ready("needs_two")
    finally:
        server.stop_expecting_success()
    # Enough of R: it loads.
    server = ServerProcess([repo], ["--rate-limit=execution_count", "--rate-limit-resource=R:2"],
                           log="rate-limiter-enough.log")
    try:
        assert httpclient.InferenceServerClient(server.http_url).is_model_ready("needs_two")
    finally:
        server.stop_expecting_success()


def run_binary(args, repo):
    ports = [str(free_port()) for _ in range(3)]
    return subprocess.run(
        [str(BINARY), "--model-repository", str(repo), "--host", "127.0.0.1",
         "--http-port", ports[0], "--grpc-port", ports[1], "--metrics-port", ports[2],
         "--cores", "1", *args],
        capture_output=True, text=True, timeout=120)


def test_exit_on_error_stops_the_server_on_a_refused_model(tmp_path):
    repo = identity_repo(tmp_path / "repo")
    p = run_binary(["--rate-limit=execution_count", "--rate-limit-resource=R:1"], repo)
    out = p.stdout + p.stderr
    assert p.returncode != 0, out
    # The log quotes the reason: its quotes come escaped.
    assert TRITON_TEXT in out.replace('\\"', '"'), out


@pytest.mark.parametrize("bad", ["R", "R:x", "R:1:gpu", "R:1:0:2", ":1"])
def test_bad_resource_syntax_exits_1(tmp_path, bad):
    p = run_binary([f"--rate-limit-resource={bad}"], tmp_path)
    assert p.returncode == 1, p.stdout + p.stderr
    assert "--rate-limit-resource option format is" in p.stderr, p.stderr
