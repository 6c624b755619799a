"""Decoupled models as ensemble steps (Triton's ensemble scheduler): every
response of a decoupled step flows through the downstream steps on its own,
nested decoupled steps multiply responses, the ensemble becomes decoupled
(its config says so; unary HTTP/gRPC infer refused with Triton's texts),
the gRPC stream and HTTP generate_stream carry every response then the
final flag, a step's error ends the request, a decoupled step with no
response gives only the final flag, and an ensemble whose outputs come from
two decoupled steps is refused at load with Triton's message.

Decoupled models with the sequence batcher: a built-in decoupled model
(square) under `sequence_batching` answers each request of a sequence in
order and refuses a sequence that was never started; a decoupled Python
model keeps a running sum per sequence from its START/END control inputs
and streams several responses per request, in order, per sequence.

The repository is built here: copies of square_int32 and repeat_int32
(built-in decoupled models), an INT32 identity model, the ensembles, and
the stateful decoupled models."""

import json
import queue
import shutil
import urllib.request

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from serverproc import ROOT, ServerProcess

TIMEOUT_S = 30

INT32_IDENTITY = """
name: "int32_identity"
backend: "identity"
max_batch_size: 0
input [ { name: "INPUT0" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_INT32 dims: [ 1 ] } ]
instance_group [ { count: 1, kind: KIND_CPU } ]
"""

SQUARE_THEN_IDENTITY = """
name: "square_then_identity"
platform: "ensemble"
max_batch_size: 0
input [ { name: "IN" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
ensemble_scheduling {
  step [
    { model_name: "square_int32" model_version: -1
      input_map { key: "IN" value: "IN" } output_map { key: "OUT" value: "squared" } },
    { model_name: "int32_identity" model_version: -1
      input_map { key: "INPUT0" value: "squared" } output_map { key: "OUTPUT0" value: "OUT" } }
  ]
}
"""

REPEAT_THEN_SQUARE = """
name: "repeat_then_square"
platform: "ensemble"
max_batch_size: 0
input [
  { name: "IN" data_type: TYPE_INT32 dims: [ -1 ] },
  { name: "DELAY" data_type: TYPE_UINT32 dims: [ -1 ] },
  { name: "WAIT" data_type: TYPE_UINT32 dims: [ 1 ] }
]
output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
ensemble_scheduling {
  step [
    { model_name: "repeat_int32" model_version: -1
      input_map [ { key: "IN" value: "IN" }, { key: "DELAY" value: "DELAY" }, { key: "WAIT" value: "WAIT" } ]
      output_map { key: "OUT" value: "element" } },
    { model_name: "square_int32" model_version: -1
      input_map { key: "IN" value: "element" } output_map { key: "OUT" value: "OUT" } }
  ]
}
"""

# OUT comes from square_int32's responses, IDX from repeat_int32's: two
# decoupled flows meet at the ensemble's outputs, which Triton refuses.
MIXED_FLOWS = """
name: "mixed_flows"
platform: "ensemble"
max_batch_size: 0
input [
  { name: "IN" data_type: TYPE_INT32 dims: [ -1 ] },
  { name: "DELAY" data_type: TYPE_UINT32 dims: [ -1 ] },
  { name: "WAIT" data_type: TYPE_UINT32 dims: [ 1 ] }
]
output [
  { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] },
  { name: "IDX" data_type: TYPE_UINT32 dims: [ 1 ] }
]
ensemble_scheduling {
  step [
    { model_name: "repeat_int32" model_version: -1
      input_map [ { key: "IN" value: "IN" }, { key: "DELAY" value: "DELAY" }, { key: "WAIT" value: "WAIT" } ]
      output_map [ { key: "OUT" value: "element" }, { key: "IDX" value: "IDX" } ] },
    { model_name: "square_int32" model_version: -1
      input_map { key: "IN" value: "element" } output_map { key: "OUT" value: "OUT" } }
  ]
}
"""


SQUARE_SEQUENCE = """
name: "square_sequence"
backend: "square"
max_batch_size: 0
model_transaction_policy { decoupled: true }
sequence_batching { max_sequence_idle_microseconds: 5000000 }
input [ { name: "IN" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
instance_group [ { count: 1, kind: KIND_CPU } ]
"""

PY_BACKEND = ROOT / ".backends" / "python" / "libtriton_python.so"

PY_DECOUPLED_ACCUMULATOR = """
name: "py_decoupled_accumulator"
backend: "python"
max_batch_size: 8
model_transaction_policy { decoupled: true }
sequence_batching {
  max_sequence_idle_microseconds: 5000000
  direct { }
  control_input [
    { name: "START" control [ { kind: CONTROL_SEQUENCE_START int32_false_true: [ 0, 1 ] } ] },
    { name: "END" control [ { kind: CONTROL_SEQUENCE_END int32_false_true: [ 0, 1 ] } ] }
  ]
}
input [ { name: "INPUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "OUTPUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
instance_group [ { count: 1, kind: KIND_CPU } ]
"""

# A running sum per correlation id; each request gets three responses
# (sum, sum + 1, sum + 2), then the final flag.
PY_DECOUPLED_ACCUMULATOR_MODEL = """
import numpy as np
import triton_python_backend_utils as pb_utils


def flag(request, name):
    tensor = pb_utils.get_input_tensor_by_name(request, name)
    return tensor is not None and int(tensor.as_numpy().reshape(-1)[0]) != 0


class TritonPythonModel:
    def initialize(self, args):
        self.sums = {}

    def execute(self, requests):
        for request in requests:
            sender = request.get_response_sender()
            value = pb_utils.get_input_tensor_by_name(request, "INPUT").as_numpy()
            key = request.correlation_id()
            if flag(request, "START") or key not in self.sums:
                total = value.astype(np.int32)
            else:
                total = (self.sums[key] + value).astype(np.int32)
            self.sums[key] = total
            for i in range(3):
                out = pb_utils.Tensor("OUTPUT", (total + i).astype(np.int32))
                sender.send(pb_utils.InferenceResponse(output_tensors=[out]))
            if flag(request, "END"):
                self.sums.pop(key, None)
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
"""


def write_model(repo, name, config):
    (repo / name / "1").mkdir(parents=True)
    (repo / name / "config.pbtxt").write_text(config)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    repo = tmp_path_factory.mktemp("decoupled-ensemble-repo")
    for name in ("square_int32", "repeat_int32"):
        shutil.copytree(ROOT / "models" / name, repo / name)
    write_model(repo, "int32_identity", INT32_IDENTITY)
    write_model(repo, "square_then_identity", SQUARE_THEN_IDENTITY)
    write_model(repo, "repeat_then_square", REPEAT_THEN_SQUARE)
    write_model(repo, "mixed_flows", MIXED_FLOWS)
    write_model(repo, "square_sequence", SQUARE_SEQUENCE)
    if PY_BACKEND.exists():
        write_model(repo, "py_decoupled_accumulator", PY_DECOUPLED_ACCUMULATOR)
        (repo / "py_decoupled_accumulator" / "1" / "model.py").write_text(
            PY_DECOUPLED_ACCUMULATOR_MODEL)
    # mixed_flows fails to load by design: keep serving the others.
    proc = ServerProcess([repo], ["--exit-on-error=false", "--strict-readiness=false"],
                         log="python-decoupled-ensemble-server.log", ready_timeout_s=90)
    yield proc
    proc.stop_expecting_success()


class Stream:
    def __init__(self, url):
        self.client = grpcclient.InferenceServerClient(url)
        self.results = queue.Queue()
        self.client.start_stream(callback=lambda result, error: self.results.put((result, error)))

    def send(self, model, inputs, request_id, final=True, **sequence):
        self.client.async_stream_infer(model_name=model, inputs=inputs, request_id=request_id,
                                       enable_empty_final_response=final, **sequence)

    def until_final(self):
        """Every response up to and including the final flag (an error ends
        the request too)."""
        got = []
        while True:
            result, error = self.results.get(timeout=TIMEOUT_S)
            got.append((result, error))
            if error is not None or final_flag(result):
                return got

    def close(self):
        self.client.stop_stream()
        self.client.close()


def final_flag(result):
    p = result.get_response().parameters.get("triton_final_response")
    return p is not None and p.bool_param


@pytest.fixture
def stream(server):
    s = Stream(server.grpc_url)
    yield s
    s.close()


def square_inputs(module, n):
    i = module.InferInput("IN", [1], "INT32")
    i.set_data_from_numpy(np.array([n], dtype=np.int32))
    return [i]


def repeat_inputs(values, delays, wait=0):
    inputs = [
        grpcclient.InferInput("IN", [len(values)], "INT32"),
        grpcclient.InferInput("DELAY", [len(delays)], "UINT32"),
        grpcclient.InferInput("WAIT", [1], "UINT32"),
    ]
    inputs[0].set_data_from_numpy(np.array(values, dtype=np.int32))
    inputs[1].set_data_from_numpy(np.array(delays, dtype=np.uint32))
    inputs[2].set_data_from_numpy(np.array([wait], dtype=np.uint32))
    return inputs


def test_each_response_of_the_decoupled_step_runs_the_downstream_step(server, stream):
    stream.send("square_then_identity", square_inputs(grpcclient, 3), "sq3")
    got = stream.until_final()
    assert all(error is None for _, error in got), got
    data, (last, _) = got[:-1], got[-1]
    assert [r.as_numpy("OUT").tolist() for r, _ in data] == [[3], [3], [3]]
    assert all(r.get_response().model_name == "square_then_identity" for r, _ in data)
    assert all(r.get_response().id == "sq3" for r, _ in data)
    assert len(last.get_response().outputs) == 0
    # Each response went through int32_identity: three executions.
    stats = grpcclient.InferenceServerClient(server.grpc_url).get_inference_statistics(
        "int32_identity", as_json=True)
    assert int(stats["model_stats"][0]["inference_stats"]["success"]["count"]) >= 3


def test_no_response_from_the_decoupled_step_gives_only_the_final_flag(stream):
    stream.send("square_then_identity", square_inputs(grpcclient, 0), "sq0")
    (result, error), = stream.until_final()
    assert error is None
    assert final_flag(result) and len(result.get_response().outputs) == 0


def test_nested_decoupled_steps_multiply_responses(stream):
    stream.send("repeat_then_square", repeat_inputs([2, 3], [0, 0]), "nested")
    got = stream.until_final()
    assert all(error is None for _, error in got), got
    values = sorted(r.as_numpy("OUT").tolist()[0] for r, _ in got[:-1])
    assert values == [2, 2, 3, 3, 3]


def test_a_failing_step_ends_the_request_with_its_error(stream):
    # repeat_int32 refuses DELAY of another shape than IN.
    stream.send("repeat_then_square", repeat_inputs([1, 2], [0]), "bad")
    got = stream.until_final()
    result, error = got[-1]
    assert error is not None
    assert "repeat_then_square" in str(error) and "DELAY" in str(error)
    # The stream keeps serving.
    stream.send("square_then_identity", square_inputs(grpcclient, 1), "after")
    got = stream.until_final()
    assert [r.as_numpy("OUT").tolist() for r, _ in got[:-1]] == [[1]]


def test_the_ensemble_is_decoupled_and_unary_infer_is_refused(server):
    g = grpcclient.InferenceServerClient(server.grpc_url)
    config = g.get_model_config("square_then_identity", as_json=True)["config"]
    assert config["model_transaction_policy"]["decoupled"] is True
    with pytest.raises(InferenceServerException) as e:
        g.infer("square_then_identity", square_inputs(grpcclient, 1))
    assert "ModelInfer RPC doesn't support models with decoupled transaction policy" in str(e.value)
    h = httpclient.InferenceServerClient(server.http_url)
    with pytest.raises(InferenceServerException) as e:
        h.infer("square_then_identity", square_inputs(httpclient, 1))
    assert "HTTP end point doesn't support models with decoupled transaction policy" in str(e.value)


def test_generate_stream_carries_every_response(server):
    req = urllib.request.Request(
        f"http://{server.http_url}/v2/models/square_then_identity/generate_stream",
        data=json.dumps({"IN": [2]}).encode(),
        headers={"Content-Type": "application/json"},
        method="POST",
    )
    with urllib.request.urlopen(req, timeout=TIMEOUT_S) as r:
        assert r.status == 200
        events = [json.loads(line.decode()[len("data: "):]) for line in r
                  if line.decode().startswith("data: ")]
    assert [e["OUT"] for e in events] == [2, 2]
    assert all(e["model_name"] == "square_then_identity" for e in events)


def test_outputs_from_two_decoupled_steps_are_refused_at_load(server):
    h = httpclient.InferenceServerClient(server.http_url)
    index = {m["name"]: m for m in h.get_model_repository_index()}
    assert index["mixed_flows"]["state"] == "UNAVAILABLE"
    assert ("in ensemble mixed_flows, step of model 'mixed_flows' receives inputs "
            "originated from different decoupled models") in index["mixed_flows"]["reason"]
    assert index["square_then_identity"]["state"] == "READY"


def collect(stream, finals):
    """Data responses by request id, in arrival order, until `finals`
    requests have ended."""
    seen = {}
    while finals > 0:
        result, error = stream.results.get(timeout=TIMEOUT_S)
        assert error is None, error
        request_id = result.get_response().id
        if final_flag(result):
            finals -= 1
        else:
            seen.setdefault(request_id, []).append(result)
    return seen


def test_a_decoupled_model_with_the_sequence_batcher_answers_each_request(stream):
    values = [2, 1, 3]
    for i, n in enumerate(values):
        stream.send("square_sequence", square_inputs(grpcclient, n), f"s{i}", sequence_id=71,
                    sequence_start=i == 0, sequence_end=i == len(values) - 1)
    seen = collect(stream, len(values))
    for i, n in enumerate(values):
        assert [r.as_numpy("OUT").tolist() for r in seen[f"s{i}"]] == [[n]] * n


def test_a_sequence_never_started_is_refused(stream):
    stream.send("square_sequence", square_inputs(grpcclient, 1), "orphan", sequence_id=72)
    (result, error), = stream.until_final()
    assert error is not None and "72" in str(error)


@pytest.mark.skipif(not PY_BACKEND.exists(), reason="Triton's Python backend is not installed")
def test_a_decoupled_python_sequence_keeps_its_sum_and_order(stream):
    steps = {81: [5, 1, 10], 82: [100, -1, 2]}
    for i in range(3):
        for seq, values in steps.items():
            inputs = [grpcclient.InferInput("INPUT", [1, 1], "INT32")]
            inputs[0].set_data_from_numpy(np.array([[values[i]]], dtype=np.int32))
            stream.send("py_decoupled_accumulator", inputs, f"{seq}-{i}", sequence_id=seq,
                        sequence_start=i == 0, sequence_end=i == 2)
    seen = collect(stream, 6)
    for seq, values in steps.items():
        sums = np.cumsum(values).tolist()
        for i in range(3):
            got = [int(r.as_numpy("OUTPUT").reshape(-1)[0]) for r in seen[f"{seq}-{i}"]]
            # Each request's responses in order; the sum carried over from
            # the sequence's earlier requests.
            assert got == [sums[i], sums[i] + 1, sums[i] + 2]
