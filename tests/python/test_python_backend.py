"""Triton's own Python backend, unchanged, loaded through shardserve's backend
C API (models_python/): stateless and batched (py_simple), decoupled over
the gRPC stream (py_repeat_int32), a sequence (py_sequence_accumulator) and
business-logic scripting calling the built-in `simple` (py_bls).

The server is started here on `models/` and `models_python/` together. Set
PYBACKEND_HTTP_URL and PYBACKEND_GRPC_URL to run the same checks against
another server (e.g. real Triton serving models_python/ with py_bls's
target_model set to py_simple)."""

import os
import queue
import urllib.request

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from serverproc import ROOT, ServerProcess

BACKEND = ROOT / ".backends" / "python" / "libtriton_python.so"
MODELS = ["py_simple", "py_repeat_int32", "py_sequence_accumulator", "py_bls"]
TIMEOUT_S = 30


class Urls:
    def __init__(self, http, grpc, metrics=None):
        self.http = http
        self.grpc = grpc
        self.metrics = metrics


@pytest.fixture(scope="module")
def urls():
    if os.environ.get("PYBACKEND_HTTP_URL"):
        yield Urls(
            os.environ["PYBACKEND_HTTP_URL"],
            os.environ["PYBACKEND_GRPC_URL"],
            os.environ.get("PYBACKEND_METRICS_URL"),
        )
        return
    if not BACKEND.exists():
        pytest.skip(f"Triton's Python backend is not installed ({BACKEND}); scripts/setup.sh installs it")
    server = ServerProcess([ROOT / "models", ROOT / "models_python"],
                           log="python-backend-server.log", ready_timeout_s=90)
    yield Urls(server.http_url, server.grpc_url, server.metrics_url)
    server.stop_expecting_success(timeout_s=30)


@pytest.fixture(scope="module")
def http(urls):
    return httpclient.InferenceServerClient(urls.http, concurrency=8)


@pytest.fixture(scope="module")
def grpc(urls):
    return grpcclient.InferenceServerClient(urls.grpc)


def simple_inputs(client_mod, a, b):
    inputs = [
        client_mod.InferInput("INPUT0", list(a.shape), "INT32"),
        client_mod.InferInput("INPUT1", list(b.shape), "INT32"),
    ]
    inputs[0].set_data_from_numpy(a)
    inputs[1].set_data_from_numpy(b)
    return inputs


def test_python_models_are_ready(http):
    for m in MODELS:
        assert http.is_model_ready(m), f"{m} is not ready"
    config = http.get_model_config("py_simple")
    assert config["backend"] == "python"
    assert config["max_batch_size"] == 8


@pytest.mark.parametrize("proto", ["http", "grpc"])
def test_stateless_add_sub(http, grpc, proto):
    client, mod = (http, httpclient) if proto == "http" else (grpc, grpcclient)
    a = np.arange(16, dtype=np.int32).reshape(1, 16)
    b = np.full((1, 16), 3, dtype=np.int32)
    a[0, 0] = np.iinfo(np.int32).max
    result = client.infer("py_simple", simple_inputs(mod, a, b))
    with np.errstate(over="ignore"):
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - b)
    assert result.as_numpy("OUTPUT0")[0, 0] == np.iinfo(np.int32).min + 2


def test_batched_requests_and_dynamic_batching(http):
    rows = np.arange(8 * 16, dtype=np.int32).reshape(8, 16)
    ones = np.ones((8, 16), dtype=np.int32)
    result = http.infer("py_simple", simple_inputs(httpclient, rows, ones))
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), rows + 1)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), rows - 1)

    before = http.get_inference_statistics("py_simple")["model_stats"][0]
    pending = []
    for i in range(24):
        a = np.full((1, 16), i, dtype=np.int32)
        pending.append((i, http.async_infer("py_simple", simple_inputs(httpclient, a, a))))
    for i, p in pending:
        r = p.get_result(timeout=TIMEOUT_S)
        np.testing.assert_array_equal(r.as_numpy("OUTPUT0"), np.full((1, 16), 2 * i))
        np.testing.assert_array_equal(r.as_numpy("OUTPUT1"), np.zeros((1, 16)))
    after = http.get_inference_statistics("py_simple")["model_stats"][0]
    assert int(after["inference_count"]) - int(before["inference_count"]) == 24
    executions = int(after["execution_count"]) - int(before["execution_count"])
    assert 1 <= executions <= 24

    too_many = np.zeros((9, 16), dtype=np.int32)
    with pytest.raises(InferenceServerException) as e:
        http.infer("py_simple", simple_inputs(httpclient, too_many, too_many))
    assert "batch" in str(e.value)


def model_metric(urls, name, model):
    with urllib.request.urlopen(f"http://{urls.metrics}/metrics", timeout=5) as r:
        text = r.read().decode()
    series = f'{name}{{model="{model}",version="1"}} '
    values = [l[len(series):] for l in text.splitlines() if l.startswith(series)]
    assert len(values) == 1, f"expected one {series!r} sample in:\n{text}"
    return float(values[0])


def test_a_batched_request_counts_its_rows_in_one_execution(http, urls):
    """The backend's own reports (TRITONBACKEND_ModelInstanceReport[Batch]Statistics)
    drive the counts, as in Triton: one request of 5 rows is 5 inferences,
    1 execution of batch size 5, 1 success, each counted once."""
    names = ["nv_inference_count", "nv_inference_exec_count", "nv_inference_request_success"]
    metrics_before = [model_metric(urls, n, "py_simple") for n in names] if urls.metrics else None
    before = http.get_inference_statistics("py_simple")["model_stats"][0]
    rows = np.arange(5 * 16, dtype=np.int32).reshape(5, 16)
    result = http.infer("py_simple", simple_inputs(httpclient, rows, rows))
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), rows * 2)
    after = http.get_inference_statistics("py_simple")["model_stats"][0]

    def delta(*path):
        a, b = after, before
        for key in path:
            a, b = a[key], b[key]
        return int(a) - int(b)

    assert delta("inference_count") == 5
    assert delta("execution_count") == 1
    assert delta("inference_stats", "success", "count") == 1
    assert delta("inference_stats", "compute_infer", "count") == 1
    assert delta("inference_stats", "queue", "count") == 1

    def batch5(stats):
        return next((int(b["compute_infer"]["count"]) for b in stats["batch_stats"]
                     if int(b["batch_size"]) == 5), 0)

    assert batch5(after) - batch5(before) == 1
    if urls.metrics:
        metrics_after = [model_metric(urls, n, "py_simple") for n in names]
        assert [a - b for a, b in zip(metrics_after, metrics_before)] == [5, 1, 1]


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


def test_decoupled_responses_over_the_grpc_stream(urls):
    client = grpcclient.InferenceServerClient(urls.grpc)
    results = queue.Queue()
    client.start_stream(callback=lambda result, error: results.put((result, error)))
    try:
        client.async_stream_infer(
            "py_repeat_int32",
            repeat_inputs([4, 5, 6], [1, 1, 1], 0),
            request_id="a",
            enable_empty_final_response=True,
        )
        got = []
        while True:
            result, error = results.get(timeout=TIMEOUT_S)
            assert error is None, error
            response = result.get_response()
            if response.parameters["triton_final_response"].bool_param:
                assert len(response.outputs) == 0
                break
            got.append((int(result.as_numpy("OUT")[0]), int(result.as_numpy("IDX")[0])))
        assert got == [(4, 0), (5, 1), (6, 2)]

        # An error response keeps the stream usable.
        client.async_stream_infer("py_repeat_int32", repeat_inputs([1, 2], [1], 0), request_id="bad")
        result, error = results.get(timeout=TIMEOUT_S)
        assert result is None and "DELAY" in str(error), (result, error)
        client.async_stream_infer("py_repeat_int32", repeat_inputs([9], [0], 0), request_id="c")
        result, error = results.get(timeout=TIMEOUT_S)
        assert error is None, error
        assert int(result.as_numpy("OUT")[0]) == 9
    finally:
        client.stop_stream()
        client.close()


def starts_metric(urls):
    with urllib.request.urlopen(f"http://{urls.metrics}/metrics", timeout=5) as r:
        text = r.read().decode()
    samples = [l for l in text.splitlines() if l.startswith("py_sequence_accumulator_starts{")]
    assert len(samples) == 1, f"expected one py_sequence_accumulator_starts sample in:\n{text}"
    return float(samples[0].rsplit(" ", 1)[1])


def test_sequence_keeps_a_running_sum_per_correlation_id(grpc, urls):
    starts_before = starts_metric(urls) if urls.metrics else None

    def step(seq, value, start=False, end=False):
        i = grpcclient.InferInput("INPUT", [1, 1], "INT32")
        i.set_data_from_numpy(np.array([[value]], dtype=np.int32))
        r = grpc.infer(
            "py_sequence_accumulator",
            [i],
            sequence_id=seq,
            sequence_start=start,
            sequence_end=end,
        )
        return int(r.as_numpy("OUTPUT")[0, 0])

    assert step(1001, 5, start=True) == 5
    assert step("1001", 100, start=True) == 100
    assert step(1001, 7) == 12
    assert step("1001", 1) == 101
    assert step(1001, -2, end=True) == 10
    assert step("1001", 1, end=True) == 102
    # A new sequence with the same id starts from its own first value.
    assert step(1001, 3, start=True) == 3
    assert step(1001, 0, end=True) == 3
    # The model's custom metric (TRITONSERVER_Metric* through the C API).
    if urls.metrics:
        assert starts_metric(urls) - starts_before == 3


@pytest.mark.parametrize("proto", ["http", "grpc"])
def test_bls_calls_another_model_of_the_server(http, grpc, proto):
    client, mod = (http, httpclient) if proto == "http" else (grpc, grpcclient)
    target = http.get_model_config("py_bls")["parameters"]["target_model"]["string_value"]
    before = http.get_inference_statistics(target)["model_stats"][0]
    a = np.arange(32, dtype=np.int32).reshape(2, 16)
    b = np.full((2, 16), 10, dtype=np.int32)
    result = client.infer("py_bls", simple_inputs(mod, a, b))
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - b)
    after = http.get_inference_statistics(target)["model_stats"][0]
    # The rows went through the target model's own scheduler.
    assert int(after["inference_count"]) - int(before["inference_count"]) == 2


def test_without_the_python_backend_its_models_fail_with_the_reason(tmp_path):
    """An empty backend directory: the Python models are UNAVAILABLE with a
    reason naming the missing library; every other model serves."""
    server = ServerProcess([ROOT / "models", ROOT / "models_python"],
                           ["--backend-directory", str(tmp_path), "--exit-on-error=false",
                            "--strict-readiness=false"], log=None, cores=1)
    try:
        client = httpclient.InferenceServerClient(server.http_url)
        index = {m["name"]: m for m in client.get_model_repository_index()}
        for m in MODELS:
            assert index[m]["state"] == "UNAVAILABLE", index[m]
            assert "libtriton_python.so" in index[m]["reason"], index[m]
            assert not client.is_model_ready(m)
        a = np.ones((1, 16), dtype=np.int32)
        result = client.infer("simple", simple_inputs(httpclient, a, a))
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + a)
    finally:
        server.stop()


def test_bls_streams_a_decoupled_models_responses(http):
    a = (np.arange(16, dtype=np.int32) * 3).reshape(1, 16)
    result = http.infer("py_bls", simple_inputs(httpclient, a, a), parameters={"via": "repeat"})
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), np.arange(16).reshape(1, 16))
