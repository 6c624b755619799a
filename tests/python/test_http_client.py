"""tritonclient.http (sync) against shardserve."""

import numpy as np
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException, np_to_triton_dtype

from helpers import simple_inputs


@pytest.fixture
def client(server):
    c = httpclient.InferenceServerClient(server.http_url)
    yield c
    c.close()


def test_health_and_metadata(client):
    assert client.is_server_live()
    assert client.is_server_ready()
    meta = client.get_server_metadata()
    assert "binary_tensor_data" in meta["extensions"]
    assert client.is_model_ready("simple")
    assert not client.is_model_ready("no_such_model")
    m = client.get_model_metadata("simple")
    assert m["inputs"][0] == {"name": "INPUT0", "datatype": "INT32", "shape": [-1, 16]}
    cfg = client.get_model_config("simple")
    assert cfg["max_batch_size"] == 8
    assert [i["name"] for i in cfg["input"]] == ["INPUT0", "INPUT1"]


@pytest.mark.parametrize("binary", [True, False])
def test_infer_simple(client, binary):
    inputs, a, b = simple_inputs(httpclient, binary=binary)
    outputs = [
        httpclient.InferRequestedOutput("OUTPUT0", binary_data=binary),
        httpclient.InferRequestedOutput("OUTPUT1", binary_data=binary),
    ]
    result = client.infer("simple", inputs, outputs=outputs, request_id="7")
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - b)
    assert result.get_response()["id"] == "7"


def test_infer_batch_and_wraparound(client):
    a = np.full((4, 16), 2**31 - 1, dtype=np.int32)
    b = np.ones((4, 16), dtype=np.int32)
    inputs = [httpclient.InferInput("INPUT0", [4, 16], "INT32"), httpclient.InferInput("INPUT1", [4, 16], "INT32")]
    inputs[0].set_data_from_numpy(a)
    inputs[1].set_data_from_numpy(b)
    out = client.infer("simple", inputs).as_numpy("OUTPUT0")
    assert out.shape == (4, 16)
    assert (out == -(2**31)).all()


def test_output_subset(client):
    inputs, a, b = simple_inputs(httpclient)
    result = client.infer("simple", inputs, outputs=[httpclient.InferRequestedOutput("OUTPUT1")])
    assert result.as_numpy("OUTPUT0") is None
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - b)


def test_int8(client):
    a = np.full((1, 16), 100, dtype=np.int8)
    inputs = [httpclient.InferInput("INPUT0", [1, 16], "INT8"), httpclient.InferInput("INPUT1", [1, 16], "INT8")]
    inputs[0].set_data_from_numpy(a)
    inputs[1].set_data_from_numpy(a)
    assert (client.infer("simple_int8", inputs).as_numpy("OUTPUT0") == -56).all()


@pytest.mark.parametrize("binary", [True, False])
def test_string_model(client, binary):
    a = np.array([[str(i) for i in range(16)]], dtype=object)
    b = np.array([["1"] * 16], dtype=object)
    inputs = [httpclient.InferInput("INPUT0", [1, 16], "BYTES"), httpclient.InferInput("INPUT1", [1, 16], "BYTES")]
    inputs[0].set_data_from_numpy(a, binary_data=binary)
    inputs[1].set_data_from_numpy(b, binary_data=binary)
    outputs = [httpclient.InferRequestedOutput("OUTPUT0", binary_data=binary)]
    out = client.infer("simple_string", inputs, outputs=outputs).as_numpy("OUTPUT0")
    assert [x.decode() if isinstance(x, bytes) else x for x in out[0]] == [str(i + 1) for i in range(16)]


def test_identity_bytes_round_trip(client):
    data = np.array([[b"", b"a\x00b", "héllo".encode()]], dtype=object)
    inp = httpclient.InferInput("INPUT0", [1, 3], "BYTES")
    inp.set_data_from_numpy(data, binary_data=True)
    out = client.infer("simple_identity", [inp]).as_numpy("OUTPUT0")
    assert out.shape == (1, 3)
    assert list(out[0]) == [b"", b"a\x00b", "héllo".encode()]


def test_compression(client):
    inputs, a, b = simple_inputs(httpclient)
    for req_alg, resp_alg in (("gzip", "gzip"), ("deflate", "deflate"), ("gzip", None)):
        result = client.infer(
            "simple", inputs, request_compression_algorithm=req_alg, response_compression_algorithm=resp_alg
        )
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)


def test_errors_raise_with_clear_messages(client):
    inputs, _, _ = simple_inputs(httpclient)
    with pytest.raises(InferenceServerException, match="Request for unknown model"):
        client.infer("no_such_model", inputs)
    bad = [httpclient.InferInput("INPUT0", [1, 16], "FP32"), inputs[1]]
    bad[0].set_data_from_numpy(np.zeros((1, 16), dtype=np.float32))
    with pytest.raises(InferenceServerException, match="FP32"):
        client.infer("simple", bad)
    with pytest.raises(InferenceServerException, match="INPUT1"):
        client.infer("simple", inputs[:1])
    big = [httpclient.InferInput("INPUT0", [9, 16], "INT32"), httpclient.InferInput("INPUT1", [9, 16], "INT32")]
    for i in big:
        i.set_data_from_numpy(np.zeros((9, 16), dtype=np.int32))
    with pytest.raises(InferenceServerException, match="batch-size"):
        client.infer("simple", big)
    with pytest.raises(InferenceServerException):
        client.infer("simple", inputs, outputs=[httpclient.InferRequestedOutput("NOPE")])
    assert client.is_server_ready()


def test_all_dtypes_through_identity_helpers():
    # Sanity of the helper mapping used elsewhere.
    assert np_to_triton_dtype(np.int32) == "INT32"


def _raw_post(server, model, body):
    """A raw binary request (`Inference-Header-Content-Length: 0`): the
    body is the data of the model's one input."""
    import urllib.error
    import urllib.request

    req = urllib.request.Request(
        f"http://{server.http_url}/v2/models/{model}/infer", data=body, method="POST",
        headers={"Inference-Header-Content-Length": "0",
                 "Content-Type": "application/octet-stream"})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, r.headers, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.headers, e.read()


def test_raw_binary_request(server):
    x = np.random.default_rng(3).random(256, dtype=np.float32)
    status, headers, body = _raw_post(server, "mlp_onnx", x.tobytes())
    assert status == 200, body
    n = int(headers["Inference-Header-Content-Length"])
    import json
    header = json.loads(body[:n])
    out = header["outputs"][0]
    assert out["name"] == "OUTPUT0" and out["shape"][0] == 1
    assert out["parameters"]["binary_data_size"] == len(body) - n
    # The same as a JSON request for a batch of one.
    c = httpclient.InferenceServerClient(server.http_url)
    i0 = httpclient.InferInput("INPUT0", [1, 256], "FP32")
    i0.set_data_from_numpy(x.reshape(1, 256))
    expected = c.infer("mlp_onnx", [i0]).as_numpy("OUTPUT0")
    c.close()
    got = np.frombuffer(body[n:], dtype=np.float32).reshape(expected.shape)
    np.testing.assert_allclose(got, expected, rtol=1e-6)


def test_raw_binary_request_refusals(server):
    status, _, body = _raw_post(server, "simple", np.zeros(32, np.int32).tobytes())
    assert status == 400
    assert ("Raw request must only have 1 input (found 1) to be deduced but got 2 inputs "
            "in 'simple' model configuration") in body.decode()
    status, _, body = _raw_post(server, "simple_identity", b"427")
    assert status == 400
    assert ("For BYTE datatype raw input 'INPUT0', the model must have input shape [1]"
            in body.decode())
    status, _, body = _raw_post(server, "mlp_onnx", b"\0" * 12)
    assert status == 400
    assert ("input byte size mismatch for input 'INPUT0' for model 'mlp_onnx'. "
            "Expected 1024, got 12") in body.decode()


def test_server_metadata_lists_tritons_extensions(client):
    exts = client.get_server_metadata()["extensions"]
    # Triton 2.51's order; cuda_shared_memory only where a GPU can serve it.
    triton = ["classification", "sequence", "model_repository",
              "model_repository(unload_dependents)", "schedule_policy", "model_configuration",
              "system_shared_memory", "cuda_shared_memory", "binary_tensor_data", "parameters",
              "statistics", "trace", "logging"]
    assert exts == [e for e in triton if e != "cuda_shared_memory" or e in exts]
