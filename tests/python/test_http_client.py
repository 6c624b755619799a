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
