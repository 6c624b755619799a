"""Decoupled models with tritonclient over the gRPC stream (repeat_int32,
square_int32: interleaved requests, zero elements, the empty final
response flag, output subsets, errors that keep the stream open), Triton's
refusals on unary infer, the generate extension's SSE stream with plain
HTTP, and Triton's simple_grpc_custom_repeat.py example unchanged."""

import json
import os
import pathlib
import queue
import re
import subprocess
import sys
import urllib.error
import urllib.request

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

TIMEOUT_S = 30
EXAMPLES = pathlib.Path(__file__).resolve().parent / "examples"


def repeat_inputs(values, delays, wait):
    inputs = [
        grpcclient.InferInput("IN", [len(values)], "INT32"),
        grpcclient.InferInput("DELAY", [len(delays)], "UINT32"),
        grpcclient.InferInput("WAIT", [1], "UINT32"),
    ]
    inputs[0].set_data_from_numpy(np.array(values, dtype=np.int32))
    inputs[1].set_data_from_numpy(np.array(delays, dtype=np.uint32))
    inputs[2].set_data_from_numpy(np.array([wait], dtype=np.uint32))
    return inputs


def square_inputs(n):
    i = grpcclient.InferInput("IN", [1], "INT32")
    i.set_data_from_numpy(np.array([n], dtype=np.int32))
    return [i]


class Stream:
    """A started stream whose callback results land in a queue."""

    def __init__(self, url):
        self.client = grpcclient.InferenceServerClient(url)
        self.results = queue.Queue()
        self.client.start_stream(callback=lambda result, error: self.results.put((result, error)))

    def send(self, model, inputs, request_id, final=False, outputs=None):
        self.client.async_stream_infer(
            model_name=model,
            inputs=inputs,
            request_id=request_id,
            outputs=outputs,
            enable_empty_final_response=final,
        )

    def take(self, n):
        return [self.results.get(timeout=TIMEOUT_S) for _ in range(n)]

    def nothing_more(self, wait_s=0.3):
        try:
            extra = self.results.get(timeout=wait_s)
        except queue.Empty:
            return True
        pytest.fail(f"unexpected response {extra}")

    def close(self):
        self.client.stop_stream()
        self.client.close()


def final_flag(result):
    p = result.get_response().parameters.get("triton_final_response")
    return None if p is None else p.bool_param


@pytest.fixture
def stream(server):
    s = Stream(server.grpc_url)
    yield s
    s.close()


def test_repeat_sends_each_element_then_the_empty_final_response(stream):
    values = [4, 5, 6]
    stream.send("repeat_int32", repeat_inputs(values, [1, 1, 1], 0), "r1", final=True)
    got = stream.take(4)
    for i, (result, error) in enumerate(got[:3]):
        assert error is None, error
        assert result.get_response().id == "r1"
        assert final_flag(result) is False
        assert result.as_numpy("OUT").tolist() == [values[i]]
        assert result.as_numpy("IDX").tolist() == [i]
    last, error = got[3]
    assert error is None
    assert final_flag(last) is True
    assert last.get_response().id == "r1"
    assert len(last.get_response().outputs) == 0
    stream.nothing_more()


def test_without_the_flag_only_data_responses_arrive(stream):
    stream.send("repeat_int32", repeat_inputs([1, 2], [0, 0], 0), "r2")
    got = stream.take(2)
    assert [r.as_numpy("OUT").tolist() for r, _ in got] == [[1], [2]]
    assert all(final_flag(r) is None for r, _ in got)
    stream.nothing_more()


def test_zero_elements_give_only_the_final_flag(stream):
    stream.send("repeat_int32", repeat_inputs([], [], 0), "empty", final=True)
    (result, error), = stream.take(1)
    assert error is None and final_flag(result) is True
    stream.send("repeat_int32", repeat_inputs([], [], 0), "silent")
    stream.nothing_more()
    stream.send("square_int32", square_inputs(0), "sq0", final=True)
    (result, error), = stream.take(1)
    assert error is None and final_flag(result) is True


def test_interleaved_requests_keep_their_own_order(stream):
    a, b = list(range(5)), list(range(100, 105))
    stream.send("repeat_int32", repeat_inputs(a, [40] * 5, 0), "a", final=True)
    stream.send("repeat_int32", repeat_inputs(b, [40] * 5, 0), "b", final=True)
    got = stream.take(12)
    assert all(e is None for _, e in got), got
    ids = [r.get_response().id for r, _ in got]
    assert ids.index("b") < len(ids) - 1 - ids[::-1].index("a"), f"not interleaved: {ids}"
    for name, values in (("a", a), ("b", b)):
        mine = [r for r, _ in got if r.get_response().id == name]
        assert [r.as_numpy("OUT").tolist()[0] for r in mine[:-1]] == values
        assert [r.as_numpy("IDX").tolist()[0] for r in mine[:-1]] == list(range(5))
        assert final_flag(mine[-1]) is True


def test_requested_outputs_are_honoured_per_response(stream):
    stream.send("repeat_int32", repeat_inputs([9, 8], [0, 0], 0), "subset",
                outputs=[grpcclient.InferRequestedOutput("OUT")])
    for result, error in stream.take(2):
        assert error is None
        assert [o.name for o in result.get_response().outputs] == ["OUT"]
        assert result.as_numpy("IDX") is None


def test_square_sends_n_responses(stream):
    stream.send("square_int32", square_inputs(3), "sq", final=True)
    got = stream.take(4)
    assert [r.as_numpy("OUT").tolist() for r, _ in got[:3]] == [[3]] * 3
    assert final_flag(got[3][0]) is True


def test_an_error_response_keeps_the_stream_usable(stream):
    stream.send("repeat_int32", repeat_inputs([1, 2], [0], 0), "bad")
    (result, error), = stream.take(1)
    assert result is None
    assert "DELAY" in str(error)
    stream.send("square_int32", square_inputs(1), "after")
    (result, error), = stream.take(1)
    assert error is None and result.as_numpy("OUT").tolist() == [1]


def test_unary_infer_is_refused_with_tritons_errors(server):
    c = grpcclient.InferenceServerClient(server.grpc_url)
    with pytest.raises(InferenceServerException) as e:
        c.infer("repeat_int32", repeat_inputs([1], [0], 0))
    assert "ModelInfer RPC doesn't support models with decoupled transaction policy" in str(e.value)
    h = httpclient.InferenceServerClient(server.http_url)
    inputs = [
        httpclient.InferInput("IN", [1], "INT32"),
        httpclient.InferInput("DELAY", [1], "UINT32"),
        httpclient.InferInput("WAIT", [1], "UINT32"),
    ]
    inputs[0].set_data_from_numpy(np.array([1], dtype=np.int32))
    inputs[1].set_data_from_numpy(np.array([0], dtype=np.uint32))
    inputs[2].set_data_from_numpy(np.array([0], dtype=np.uint32))
    with pytest.raises(InferenceServerException) as e:
        h.infer("repeat_int32", inputs)
    assert "HTTP end point doesn't support models with decoupled transaction policy" in str(e.value)


def _post(server, path, body):
    req = urllib.request.Request(
        f"http://{server.http_url}{path}",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
        method="POST",
    )
    return urllib.request.urlopen(req, timeout=TIMEOUT_S)


def test_generate_stream_sends_one_sse_event_per_response(server):
    with _post(server, "/v2/models/repeat_int32/generate_stream",
               {"IN": [3, 1, 4], "DELAY": [0, 10, 10], "WAIT": 0}) as r:
        assert r.status == 200
        assert r.headers["Content-Type"].startswith("text/event-stream")
        events = []
        for line in r:
            line = line.decode().rstrip("\n")
            if line.startswith("data: "):
                events.append(json.loads(line[len("data: "):]))
    assert [e["OUT"] for e in events] == [3, 1, 4]
    assert [e["IDX"] for e in events] == [0, 1, 2]
    assert all(e["model_name"] == "repeat_int32" for e in events)


def test_generate_needs_exactly_one_response(server):
    with _post(server, "/v2/models/square_int32/generate", {"IN": 1}) as r:
        assert json.loads(r.read())["OUT"] == 1
    with pytest.raises(urllib.error.HTTPError) as e:
        _post(server, "/v2/models/square_int32/generate", {"IN": 2})
    assert "exactly 1 response" in json.loads(e.value.read())["error"]


def test_triton_custom_repeat_example(server):
    script = "simple_grpc_custom_repeat.py"
    cmd = [sys.executable, str(EXAMPLES / script), "-u", server.grpc_url]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=60, cwd=EXAMPLES,
                       env={**os.environ, "PYTHONUNBUFFERED": "1"})
    out = p.stdout + p.stderr
    assert p.returncode == 0, out
    assert re.search(r"^PASS", p.stdout, re.M), out
