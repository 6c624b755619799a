"""tritonclient.grpc (sync) against shardserve, plus raw gRPC edge cases."""

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.grpc import service_pb2, service_pb2_grpc
from tritonclient.utils import InferenceServerException

from helpers import simple_inputs


@pytest.fixture
def client(server):
    c = grpcclient.InferenceServerClient(server.grpc_url)
    yield c
    c.close()


def test_health_and_metadata(client):
    assert client.is_server_live()
    assert client.is_server_ready()
    assert "binary_tensor_data" in client.get_server_metadata().extensions
    assert client.is_model_ready("simple")
    assert not client.is_model_ready("no_such_model")
    m = client.get_model_metadata("simple", as_json=True)
    assert m["inputs"][0]["shape"] == ["-1", "16"]
    cfg = client.get_model_config("simple").config
    assert cfg.max_batch_size == 8
    assert [i.name for i in cfg.input] == ["INPUT0", "INPUT1"]


def test_infer_simple(client):
    inputs, a, b = simple_inputs(grpcclient)
    outputs = [grpcclient.InferRequestedOutput("OUTPUT0"), grpcclient.InferRequestedOutput("OUTPUT1")]
    result = client.infer("simple", inputs, outputs=outputs, request_id="abc")
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - b)
    assert result.get_response().id == "abc"


def test_string_and_identity(client):
    a = np.array([[str(i) for i in range(16)]], dtype=object)
    b = np.array([["-2"] * 16], dtype=object)
    inputs = [grpcclient.InferInput("INPUT0", [1, 16], "BYTES"), grpcclient.InferInput("INPUT1", [1, 16], "BYTES")]
    inputs[0].set_data_from_numpy(a)
    inputs[1].set_data_from_numpy(b)
    out = client.infer("simple_string", inputs).as_numpy("OUTPUT1")
    assert [x.decode() for x in out[0]] == [str(i + 2) for i in range(16)]
    data = np.array([[b"x\x00", b""]], dtype=object)
    inp = grpcclient.InferInput("INPUT0", [1, 2], "BYTES")
    inp.set_data_from_numpy(data)
    assert list(client.infer("simple_identity", [inp]).as_numpy("OUTPUT0")[0]) == [b"x\x00", b""]


def test_errors(client):
    inputs, _, _ = simple_inputs(grpcclient)
    with pytest.raises(InferenceServerException, match="Request for unknown model") as e:
        client.infer("no_such_model", inputs)
    assert e.value.status() == "StatusCode.NOT_FOUND"
    bad = [grpcclient.InferInput("INPUT0", [1, 16], "FP32"), inputs[1]]
    bad[0].set_data_from_numpy(np.zeros((1, 16), dtype=np.float32))
    with pytest.raises(InferenceServerException) as e:
        client.infer("simple", bad)
    assert e.value.status() == "StatusCode.INVALID_ARGUMENT"
    assert client.is_server_ready()


def _stub(server):
    channel = grpc.insecure_channel(server.grpc_url)
    return channel, service_pb2_grpc.GRPCInferenceServiceStub(channel)


def test_int8_typed_contents(server):
    channel, stub = _stub(server)
    req = service_pb2.ModelInferRequest(model_name="simple_int8")
    for name in ("INPUT0", "INPUT1"):
        t = req.inputs.add(name=name, datatype="INT8", shape=[1, 16])
        t.contents.int_contents.extend([100] * 16)
    resp = stub.ModelInfer(req)
    out = np.frombuffer(resp.raw_output_contents[0], dtype=np.int8)
    assert (out == -56).all()
    assert not resp.outputs[0].HasField("contents")
    channel.close()


def test_raw_and_typed_contents_together_is_rejected_with_tritons_message(server):
    channel, stub = _stub(server)
    req = service_pb2.ModelInferRequest(model_name="simple")
    for name in ("INPUT0", "INPUT1"):
        t = req.inputs.add(name=name, datatype="INT32", shape=[1, 16])
        t.contents.int_contents.extend([1] * 16)
        req.raw_input_contents.append(np.ones(16, dtype=np.int32).tobytes())
    with pytest.raises(grpc.RpcError) as e:
        stub.ModelInfer(req)
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert (
        "contents field must not be specified when using raw_input_contents for 'INPUT0' for model 'simple'"
        in e.value.details()
    )
    channel.close()


def test_invalid_message_unknown_rpc_and_health(server):
    channel = grpc.insecure_channel(server.grpc_url)
    raw = lambda x: x  # noqa: E731
    infer = channel.unary_unary("/inference.GRPCInferenceService/ModelInfer", request_serializer=raw, response_deserializer=raw)
    with pytest.raises(grpc.RpcError) as e:
        infer(b"\xff\xff\xff\xff\x0f")
    assert e.value.code() in (grpc.StatusCode.INTERNAL, grpc.StatusCode.INVALID_ARGUMENT)
    unknown = channel.unary_unary("/inference.GRPCInferenceService/NoSuchRpc", request_serializer=raw, response_deserializer=raw)
    with pytest.raises(grpc.RpcError) as e:
        unknown(b"")
    assert e.value.code() == grpc.StatusCode.UNIMPLEMENTED
    other = channel.unary_unary("/no.Such/Service", request_serializer=raw, response_deserializer=raw)
    with pytest.raises(grpc.RpcError) as e:
        other(b"")
    assert e.value.code() == grpc.StatusCode.UNIMPLEMENTED
    health = channel.unary_unary("/grpc.health.v1.Health/Check", request_serializer=raw, response_deserializer=raw)
    assert health(b"") == b"\x08\x01"  # status: SERVING
    channel.close()
    c = grpcclient.InferenceServerClient(server.grpc_url)
    assert c.is_server_ready()
    c.close()
