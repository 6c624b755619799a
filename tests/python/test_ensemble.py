"""Ensembles through tritonclient: `simple_ensemble` (CONTRACTS.md: `simple`
twice, so OUTPUT0 = 2·INPUT0, OUTPUT1 = 2·INPUT1) over HTTP JSON, HTTP
binary and gRPC, batched, with an output subset, its configuration and
statistics; and `mlp_pipeline` (scripts/gen_ensemble_models.py:
preprocess -> mlp_onnx -> postprocess) against its three models called one
by one."""

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException


@pytest.fixture(scope="module")
def http(server):
    client = httpclient.InferenceServerClient(server.http_url)
    yield client
    client.close()


@pytest.fixture(scope="module")
def grpc(server):
    client = grpcclient.InferenceServerClient(server.grpc_url)
    yield client
    client.close()


def simple_inputs(module, rows, binary=True):
    a = np.arange(rows * 16, dtype=np.int32).reshape(rows, 16) - 40
    b = np.full((rows, 16), 7, dtype=np.int32)
    inputs = [module.InferInput("INPUT0", [rows, 16], "INT32"), module.InferInput("INPUT1", [rows, 16], "INT32")]
    for tensor, data in zip(inputs, (a, b)):
        if module is httpclient:
            tensor.set_data_from_numpy(data, binary_data=binary)
        else:
            tensor.set_data_from_numpy(data)
    return inputs, a, b


@pytest.mark.parametrize("binary", [False, True], ids=["json", "binary"])
def test_simple_ensemble_over_http(http, binary):
    inputs, a, b = simple_inputs(httpclient, 1, binary)
    outputs = [httpclient.InferRequestedOutput(n, binary_data=binary) for n in ("OUTPUT0", "OUTPUT1")]
    result = http.infer("simple_ensemble", inputs, outputs=outputs, request_id="ens-1")
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), 2 * a)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), 2 * b)
    response = result.get_response()
    assert response["model_name"] == "simple_ensemble"
    assert response["model_version"] == "1"
    assert response["id"] == "ens-1"


def test_simple_ensemble_over_grpc_batched(grpc):
    inputs, a, b = simple_inputs(grpcclient, 8)
    result = grpc.infer("simple_ensemble", inputs)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), 2 * a)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), 2 * b)
    assert result.as_numpy("OUTPUT0").shape == (8, 16)


def test_simple_ensemble_refuses_a_batch_above_its_max(grpc):
    inputs, _, _ = simple_inputs(grpcclient, 9)
    with pytest.raises(InferenceServerException) as e:
        grpc.infer("simple_ensemble", inputs)
    assert "simple_ensemble" in str(e.value)


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_simple_ensemble_output_subset(http, grpc, protocol):
    module, client = (httpclient, http) if protocol == "http" else (grpcclient, grpc)
    inputs, _, b = simple_inputs(module, 2)
    result = client.infer("simple_ensemble", inputs, outputs=[module.InferRequestedOutput("OUTPUT1")])
    assert result.as_numpy("OUTPUT0") is None
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), 2 * b)


def test_simple_ensemble_metadata_and_config(http, grpc):
    meta = http.get_model_metadata("simple_ensemble")
    assert meta["platform"] == "ensemble"
    assert [i["name"] for i in meta["inputs"]] == ["INPUT0", "INPUT1"]
    config = http.get_model_config("simple_ensemble")
    assert [s["model_name"] for s in config["ensemble_scheduling"]["step"]] == ["simple", "simple"]
    assert config["max_batch_size"] == 8
    grpc_config = grpc.get_model_config("simple_ensemble").config
    assert [s.model_name for s in grpc_config.ensemble_scheduling.step] == ["simple", "simple"]
    assert http.is_model_ready("simple_ensemble")


def stats(http, model):
    return http.get_inference_statistics(model)["model_stats"][0]


def test_statistics_count_the_ensemble_once_and_simple_twice(http):
    before_ens = stats(http, "simple_ensemble")["inference_stats"]["success"]["count"]
    before_simple = stats(http, "simple")["inference_count"]
    inputs, _, _ = simple_inputs(httpclient, 1)
    for _ in range(3):
        http.infer("simple_ensemble", inputs)
    assert stats(http, "simple_ensemble")["inference_stats"]["success"]["count"] == before_ens + 3
    # Other tests may use `simple` at the same time only within this
    # module, which runs its tests one by one.
    assert stats(http, "simple")["inference_count"] == before_simple + 6


def test_ensemble_statistics_sum_the_composing_compute_times(grpc):
    """Triton's ensemble statistics: its own queue time, one execution per
    request, and the compute times of its steps' requests summed."""

    def read(model):
        s = grpc.get_inference_statistics(model, as_json=True)["model_stats"][0]
        i = s["inference_stats"]
        return {
            "exec": int(s.get("execution_count", 0)),
            "queue": int(i["queue"].get("count", 0)),
            **{p: int(i[p].get("ns", 0)) for p in ("compute_input", "compute_infer", "compute_output")},
            "batch2": next((int(b["compute_infer"].get("count", 0)) for b in s.get("batch_stats", []) if int(b["batch_size"]) == 2), 0),
        }

    ens0, simple0 = read("simple_ensemble"), read("simple")
    inputs, _, _ = simple_inputs(grpcclient, 2)
    for _ in range(3):
        grpc.infer("simple_ensemble", inputs)
    ens, simple = read("simple_ensemble"), read("simple")
    assert ens["exec"] - ens0["exec"] == 3
    assert ens["queue"] - ens0["queue"] == 3
    assert ens["batch2"] - ens0["batch2"] == 3
    assert simple["exec"] - simple0["exec"] == 6
    # This module runs its tests one by one, so only the ensemble used
    # `simple` meanwhile.
    for phase in ("compute_input", "compute_infer", "compute_output"):
        assert ens[phase] - ens0[phase] == simple[phase] - simple0[phase], phase
    assert ens["compute_infer"] > ens0["compute_infer"]


def test_mlp_pipeline_equals_its_steps_called_one_by_one(grpc):
    rng = np.random.default_rng(7)
    raw = rng.integers(0, 256, size=(3, 256), dtype=np.uint8)

    def call(model, name, data, dtype):
        tensor = grpcclient.InferInput(name, list(data.shape), dtype)
        tensor.set_data_from_numpy(data)
        return grpc.infer(model, [tensor])

    features = call("mlp_preprocess_onnx", "RAW", raw, "UINT8").as_numpy("FEATURES")
    np.testing.assert_allclose(features, (raw.astype(np.float32) - 127.5) / 127.5, rtol=1e-6)
    logits = call("mlp_onnx", "INPUT0", features, "FP32").as_numpy("OUTPUT0")
    post = call("mlp_postprocess_onnx", "LOGITS", logits, "FP32")

    result = call("mlp_pipeline", "RAW", raw, "UINT8")
    probs = result.as_numpy("PROBS")
    assert probs.shape == (3, 256)
    np.testing.assert_allclose(probs, post.as_numpy("PROBS"), rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(probs.sum(axis=1), np.ones(3), rtol=1e-5)
    np.testing.assert_array_equal(result.as_numpy("CLASS"), post.as_numpy("CLASS"))
    np.testing.assert_array_equal(result.as_numpy("CLASS")[:, 0], np.argmax(logits, axis=1))
    np.testing.assert_allclose(result.as_numpy("SCORE")[:, 0], probs.max(axis=1), rtol=1e-6)


def test_mlp_pipeline_step_failure_names_the_ensemble(http):
    tensor = httpclient.InferInput("RAW", [1, 256], "FP32")
    tensor.set_data_from_numpy(np.zeros((1, 256), dtype=np.float32))
    with pytest.raises(InferenceServerException) as e:
        http.infer("mlp_pipeline", [tensor])
    assert "RAW" in str(e.value)
    # The server keeps serving the pipeline.
    ok = httpclient.InferInput("RAW", [1, 256], "UINT8")
    ok.set_data_from_numpy(np.zeros((1, 256), dtype=np.uint8))
    assert http.infer("mlp_pipeline", [ok]).as_numpy("PROBS").shape == (1, 256)


def test_simple_ensemble_over_the_grpc_stream(server):
    import queue

    client = grpcclient.InferenceServerClient(server.grpc_url)
    answers = queue.Queue()
    client.start_stream(callback=lambda result, error: answers.put((result, error)))
    try:
        for i in range(4):
            inputs, a, b = simple_inputs(grpcclient, 1)
            client.async_stream_infer("simple_ensemble", inputs, request_id=f"s{i}")
        seen = set()
        for _ in range(4):
            result, error = answers.get(timeout=30)
            assert error is None, error
            np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), 2 * a)
            np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), 2 * b)
            seen.add(result.get_response().id)
        assert seen == {"s0", "s1", "s2", "s3"}
    finally:
        client.stop_stream()
        client.close()
