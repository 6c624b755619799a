"""`preserve_ordering` with two instances (dynamic batcher, the sequence
batcher's oldest strategy, a decoupled model): a slow first request and a
fast second one on the other instance; the second's answer is held until
the first's went out.

The models are Triton Python backend models (Triton's own backend through
shardserve's backend C API) that sleep for the milliseconds their input
says and return the time their execution ended, so the test can tell that
the fast request was held rather than merely slower. Nothing asserts a
duration: only orders (the gRPC stream's, and "answered after the slow
request's execution ended")."""

import queue
import threading
import time

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from serverproc import ROOT, ServerProcess

BACKEND = ROOT / ".backends" / "python" / "libtriton_python.so"
SLOW_MS = 1500
TIMEOUT_S = 60

MODEL_PY = '''
import time
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        import json
        self.decoupled = pb_utils.using_decoupled_model_transaction_policy(json.loads(args["model_config"]))

    def outputs(self, request):
        delay = pb_utils.get_input_tensor_by_name(request, "DELAY_MS").as_numpy()
        time.sleep(float(delay.flat[0]) / 1000.0)
        done = np.full(delay.shape, time.time_ns(), dtype=np.int64)
        return [pb_utils.Tensor("DELAY_OUT", delay.astype(np.int32)), pb_utils.Tensor("DONE_NS", done)]

    def execute(self, requests):
        if not self.decoupled:
            return [pb_utils.InferenceResponse(output_tensors=self.outputs(r)) for r in requests]
        for r in requests:
            sender = r.get_response_sender()
            for _ in range(3):
                sender.send(pb_utils.InferenceResponse(output_tensors=self.outputs(r)))
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
'''

IO = """
input [ { name: "DELAY_MS" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [
  { name: "DELAY_OUT" data_type: TYPE_INT32 dims: [ 1 ] },
  { name: "DONE_NS" data_type: TYPE_INT64 dims: [ 1 ] }
]
instance_group [ { count: 2, kind: KIND_CPU } ]
"""

MODELS = {
    "ordered": "max_batch_size: 1\ndynamic_batching { preserve_ordering: true }",
    "ordered_oldest": "max_batch_size: 1\nsequence_batching { oldest { max_candidate_sequences: 1 "
                      "preserve_ordering: true } }",
    "ordered_decoupled": "max_batch_size: 1\ndynamic_batching { preserve_ordering: true }\n"
                         "model_transaction_policy { decoupled: true }",
}


@pytest.fixture(scope="module")
def ordering_server(tmp_path_factory):
    if not BACKEND.exists():
        pytest.skip(f"Triton's Python backend is not installed ({BACKEND}); scripts/setup.sh installs it")
    repo = tmp_path_factory.mktemp("ordering-repo")
    for name, scheduling in MODELS.items():
        (repo / name / "1").mkdir(parents=True)
        (repo / name / "1" / "model.py").write_text(MODEL_PY)
        (repo / name / "config.pbtxt").write_text(f'name: "{name}"\nbackend: "python"\n{scheduling}\n{IO}')
    server = ServerProcess([repo], log="python-ordering-server.log", ready_timeout_s=120)
    yield server
    server.stop_expecting_success(timeout_s=30)


def delay_input(module, ms):
    i = module.InferInput("DELAY_MS", [1, 1], "INT32")
    i.set_data_from_numpy(np.array([[ms]], dtype=np.int32))
    return [i]


def wait_dispatched(name, n, server):
    """Polls the statistics until `n` requests left the queue (the slow one
    is executing), so the fast one is accepted after it."""
    client = httpclient.InferenceServerClient(server.http_url)
    deadline = time.time() + TIMEOUT_S
    while time.time() < deadline:
        s = client.get_inference_statistics(name)["model_stats"][0]
        if s["inference_stats"]["queue"]["count"] >= n:
            return
        time.sleep(0.02)
    pytest.fail(f"the slow request to {name} never left the queue")


def queued(name, server):
    client = httpclient.InferenceServerClient(server.http_url)
    return client.get_inference_statistics(name)["model_stats"][0]["inference_stats"]["queue"]["count"]


@pytest.mark.parametrize("name", ["ordered", "ordered_oldest", "ordered_decoupled"])
def test_grpc_stream_answers_in_queue_order(ordering_server, name):
    results = queue.Queue()
    client = grpcclient.InferenceServerClient(ordering_server.grpc_url)
    client.start_stream(callback=lambda result, error: results.put((result, error)))
    sequence = name == "ordered_oldest"
    before = queued(name, ordering_server)
    # The slow sequence stays open, holding its instance's only slot, so
    # the fast one goes to the other instance.
    client.async_stream_infer(name, delay_input(grpcclient, SLOW_MS), request_id="slow",
                              **({"sequence_id": 1, "sequence_start": True, "sequence_end": False}
                                 if sequence else {}))
    wait_dispatched(name, before + 1, ordering_server)
    client.async_stream_infer(name, delay_input(grpcclient, 0), request_id="fast",
                              **({"sequence_id": 2, "sequence_start": True, "sequence_end": True}
                                 if sequence else {}))
    per_request = 3 if name == "ordered_decoupled" else 1
    got = []
    for _ in range(2 * per_request):
        result, error = results.get(timeout=TIMEOUT_S)
        assert error is None, error
        got.append((result.get_response().id, int(result.as_numpy("DONE_NS").flat[0]),
                    time.time_ns()))
    client.stop_stream()
    client.close()
    assert [g[0] for g in got] == ["slow"] * per_request + ["fast"] * per_request, got
    slow_done = max(g[1] for g in got if g[0] == "slow")
    assert all(arrived >= slow_done for rid, _, arrived in got if rid == "fast"), got


def test_http_fast_request_waits_for_the_slow_one(ordering_server):
    name = "ordered"
    slow = {}

    def send_slow():
        c = httpclient.InferenceServerClient(ordering_server.http_url)
        slow["result"] = c.infer(name, delay_input(httpclient, SLOW_MS))

    before = queued(name, ordering_server)
    t = threading.Thread(target=send_slow)
    t.start()
    wait_dispatched(name, before + 1, ordering_server)
    c = httpclient.InferenceServerClient(ordering_server.http_url)
    fast = c.infer(name, delay_input(httpclient, 0))
    fast_arrived = time.time_ns()
    t.join(TIMEOUT_S)
    assert "result" in slow
    slow_done = int(slow["result"].as_numpy("DONE_NS").flat[0])
    # Answered only after the slow request's execution ended, although its
    # own ended first (the other instance was free).
    assert fast_arrived >= slow_done
    assert int(fast.as_numpy("DONE_NS").flat[0]) <= fast_arrived
