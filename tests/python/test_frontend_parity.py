"""The three front ends over one infer path: the same request sent over
HTTP, over gRPC and in-process (the C API's TRITONSERVER_ServerInferAsync,
reached through a Python-backend model's BLS call) gives the same answer,
the same error text and the same statistics deltas (model statistics and
`nv_inference_request_failure{reason=...}`), and a `timeout` that expires
in the queue behind a busy model fails the same way on each.

Triton's counting is the reference: a request refused before it reaches
its model's scheduler (wrong datatype, unknown input) is counted nowhere;
one that times out in the queue is one failure with reason REJECTED."""

import json
import queue
import re
import time
import urllib.request

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from serverproc import ROOT, ServerProcess

BACKEND = ROOT / ".backends" / "python" / "libtriton_python.so"
REASONS = ("REJECTED", "CANCELED", "BACKEND", "OTHER")
BUSY_MS = 700
TIMEOUT_US = 100_000
FRONT_ENDS = ("http", "grpc", "inprocess")

IDENTITY = """
name: "{name}"
backend: "identity"
max_batch_size: 1
input [ {{ name: "INPUT0" data_type: TYPE_INT32 dims: [ 4 ] }} ]
output [ {{ name: "OUTPUT0" data_type: TYPE_INT32 dims: [ 4 ] }} ]
instance_group [ {{ count: 1 kind: KIND_CPU }} ]
{extra}
"""

FORWARD_CONFIG = """
name: "py_forward"
backend: "python"
max_batch_size: 1
input [ { name: "INPUT0" data_type: TYPE_INT32 dims: [ 4 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_INT32 dims: [ 4 ] } ]
instance_group [ { count: 2 kind: KIND_CPU } ]
"""

# Sends its INPUT0 on to the model named by the request parameter
# `target`, in-process, shaped as `mode` says (the same bad requests the
# test sends over the network), with the `timeout_us` it is given, and
# answers the target's output or its error text unchanged.
FORWARD_MODEL = '''
import json

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        return [self._forward(r) for r in requests]

    def _forward(self, request):
        params = json.loads(request.parameters() or "{}")
        data = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
        mode = params.get("mode", "ok")
        if mode == "wrong_dtype":
            inputs = [pb_utils.Tensor("INPUT0", data.astype(np.float32))]
        elif mode == "unknown_input":
            inputs = [pb_utils.Tensor("INPUT0", data), pb_utils.Tensor("BOGUS", data)]
        else:
            inputs = [pb_utils.Tensor("INPUT0", data)]
        answer = pb_utils.InferenceRequest(
            model_name=params["target"],
            requested_output_names=["OUTPUT0"],
            inputs=inputs,
            timeout=int(params.get("timeout_us", 0)),
        ).exec()
        if answer.has_error():
            return pb_utils.InferenceResponse(error=pb_utils.TritonError(answer.error().message()))
        return pb_utils.InferenceResponse(
            output_tensors=[pb_utils.get_output_tensor_by_name(answer, "OUTPUT0")]
        )
'''


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    if not BACKEND.exists():
        pytest.skip(f"Triton's Python backend is not installed ({BACKEND}); scripts/setup.sh installs it")
    repo = tmp_path_factory.mktemp("parity")
    models = {
        "plain": IDENTITY.format(name="plain", extra=""),
        "busy": IDENTITY.format(
            name="busy",
            extra=f'parameters {{ key: "execute_delay_ms" value: {{ string_value: "{BUSY_MS}" }} }}',
        ),
        "py_forward": FORWARD_CONFIG,
    }
    for name, config in models.items():
        (repo / name / "1").mkdir(parents=True)
        (repo / name / "config.pbtxt").write_text(config)
    (repo / "py_forward" / "1" / "model.py").write_text(FORWARD_MODEL)
    proc = ServerProcess([repo], log="frontend-parity-server.log", ready_timeout_s=90)
    yield proc
    proc.stop_expecting_success(timeout_s=30)


@pytest.fixture(scope="module")
def http(server):
    return httpclient.InferenceServerClient(server.http_url, concurrency=4)


@pytest.fixture(scope="module")
def grpc(server):
    return grpcclient.InferenceServerClient(server.grpc_url)


def data():
    return np.array([[1, 2, 3, 4]], dtype=np.int32)


def network_inputs(mod, mode):
    """The request each mode stands for, as a network client sends it."""
    values = data()
    if mode == "wrong_dtype":
        x = mod.InferInput("INPUT0", [1, 4], "FP32")
        x.set_data_from_numpy(values.astype(np.float32))
        return [x]
    x = mod.InferInput("INPUT0", [1, 4], "INT32")
    x.set_data_from_numpy(values)
    if mode == "unknown_input":
        bogus = mod.InferInput("BOGUS", [1, 4], "INT32")
        bogus.set_data_from_numpy(values)
        return [x, bogus]
    return [x]


def send(clients, front_end, target, mode="ok", timeout_us=0):
    """One request to `target` over `front_end`: its OUTPUT0, or the
    error text it was answered with."""
    http, grpc = clients
    try:
        if front_end == "inprocess":
            x = httpclient.InferInput("INPUT0", [1, 4], "INT32")
            x.set_data_from_numpy(data())
            params = {"target": target, "mode": mode, "timeout_us": timeout_us}
            result = http.infer("py_forward", [x], parameters=params)
        else:
            client, mod = (http, httpclient) if front_end == "http" else (grpc, grpcclient)
            # tritonclient sends `timeout` as the request parameter Triton reads.
            extra = {"timeout": timeout_us} if timeout_us else {}
            result = client.infer(target, network_inputs(mod, mode), **extra)
        return result.as_numpy("OUTPUT0"), None
    except InferenceServerException as e:
        return None, e.message()


def counts(server, http, model):
    """The model's success and failure counts, and its failures by reason."""
    stats = http.get_inference_statistics(model)["model_stats"][0]["inference_stats"]
    with urllib.request.urlopen(f"http://{server.metrics_url}/metrics", timeout=10) as r:
        text = r.read().decode()
    by_reason = {}
    for reason in REASONS:
        m = re.search(
            rf'nv_inference_request_failure\{{model="{model}",version="1",reason="{reason}"\}} (\d+)', text
        )
        by_reason[reason] = int(m.group(1)) if m else 0
    return {
        "success": int(stats["success"]["count"]),
        "fail": int(stats["fail"]["count"]),
        **{f"fail_{k}": v for k, v in by_reason.items()},
    }


def delta(before, after):
    return {k: after[k] - before[k] for k in before}


def pending(server, model):
    with urllib.request.urlopen(f"http://{server.metrics_url}/metrics", timeout=10) as r:
        text = r.read().decode()
    m = re.search(rf'nv_inference_pending_request_count\{{model="{model}",version="1"\}} (\d+)', text)
    return int(m.group(1)) if m else 0


@pytest.mark.parametrize("mode", ["ok", "wrong_dtype", "unknown_input"])
def test_same_request_same_answer_and_statistics(server, http, grpc, mode):
    answers, deltas = {}, {}
    for front_end in FRONT_ENDS:
        before = counts(server, http, "plain")
        answers[front_end] = send((http, grpc), front_end, "plain", mode)
        deltas[front_end] = delta(before, counts(server, http, "plain"))
    if mode == "ok":
        for front_end, (out, error) in answers.items():
            assert error is None, f"{front_end}: {error}"
            np.testing.assert_array_equal(out, data())
        expected = {"success": 1, "fail": 0}
    else:
        errors = {f: error for f, (_, error) in answers.items()}
        assert all(errors.values()), errors
        # The Python backend words a refused in-process request its own way
        # around the server's text (its request_executor.cc, as in Triton).
        errors["inprocess"] = errors["inprocess"].removeprefix(
            "Model plain - Error when running inference: "
        )
        assert len(set(errors.values())) == 1, json.dumps(errors, indent=1)
        # Refused before reaching the model: counted nowhere, as in Triton.
        expected = {"success": 0, "fail": 0}
    for front_end, d in deltas.items():
        assert d == {**expected, **{f"fail_{r}": 0 for r in REASONS}}, (front_end, deltas)


def test_a_timeout_expiring_in_the_queue_fails_alike(server, http, grpc):
    """Behind a busy model, a request whose `timeout` passes while it is
    queued is refused with Triton's error, counted once as REJECTED, over
    each front end; the model never runs it."""
    for front_end in FRONT_ENDS:
        before = counts(server, http, "busy")
        done = queue.Queue()
        for _ in range(2):
            grpc.async_infer("busy", network_inputs(grpcclient, "ok"),
                             callback=lambda result, error: done.put(error))
        # Once a blocker is seen waiting, every later request queues behind
        # at least one BUSY_MS execution.
        deadline = time.monotonic() + 30
        while pending(server, "busy") == 0:
            assert time.monotonic() < deadline, "the blockers never queued"
            time.sleep(0.005)
        started = time.monotonic()
        out, error = send((http, grpc), front_end, "busy", timeout_us=TIMEOUT_US)
        waited = time.monotonic() - started
        blocker_errors = [done.get(timeout=30) for _ in range(2)]
        assert blocker_errors == [None, None], blocker_errors
        assert out is None and error is not None, front_end
        assert "Request timeout expired" in error, (front_end, error)
        assert waited < BUSY_MS / 1000, (front_end, waited)
        d = delta(before, counts(server, http, "busy"))
        # The two blockers succeed; the timed-out request is one REJECTED failure.
        assert d == {"success": 2, "fail": 1, "fail_REJECTED": 1, "fail_CANCELED": 0,
                     "fail_BACKEND": 0, "fail_OTHER": 0}, (front_end, d)
