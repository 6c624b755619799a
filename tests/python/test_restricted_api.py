"""Triton's restricted APIs through the official tritonclient (as Triton's
qa/L0_http/http_restricted_api_test.py, and its gRPC counterpart with the
`triton-grpc-protocol-` metadata prefix), and RESOURCE_EXHAUSTED for a
gRPC message over --grpc-max-message-size."""

import queue

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException, np_to_triton_dtype

from serverproc import ROOT, ServerProcess

INFER = {"infer-key": "infer-value"}
ADMIN = {"admin-key": "admin-value"}
GRPC_INFER = {"triton-grpc-protocol-infer-key": "infer-value"}
GRPC_ADMIN = {"triton-grpc-protocol-admin-key": "admin-value"}


@pytest.fixture(scope="module")
def restricted_server():
    # HTTP health stays open: the harness polls it until the server is up.
    server = ServerProcess(
        [ROOT / "models"],
        [
            "--http-restricted-api=model-repository:admin-key=admin-value",
            "--http-restricted-api=inference,metadata:infer-key=infer-value",
            "--grpc-restricted-protocol=model-repository,health:admin-key=admin-value",
            "--grpc-restricted-protocol", "inference,metadata:infer-key=infer-value",
        ],
        log="python-restricted-server.log", cores=1)
    yield server
    server.stop_expecting_success()


def _simple_inputs(module):
    inputs = [module.InferInput("INPUT0", [1, 16], "INT32"),
              module.InferInput("INPUT1", [1, 16], "INT32")]
    inputs[0].set_data_from_numpy(np.arange(16, dtype=np.int32).reshape(1, 16))
    inputs[1].set_data_from_numpy(np.ones((1, 16), dtype=np.int32))
    return inputs


def test_http_unrestricted_api_is_open(restricted_server):
    c = httpclient.InferenceServerClient(restricted_server.http_url)
    c.get_inference_statistics("simple")
    c.get_inference_statistics("simple", headers=INFER)
    assert c.is_server_live()
    assert c.get_model_config("simple")["name"] == "simple"


def test_http_model_repository(restricted_server):
    c = httpclient.InferenceServerClient(restricted_server.http_url)
    with pytest.raises(InferenceServerException,
                       match="This API is restricted, expecting header 'admin-key'"):
        c.unload_model("simple", headers=INFER)
    with pytest.raises(InferenceServerException, match="This API is restricted"):
        c.get_model_repository_index()
    names = {m["name"] for m in c.get_model_repository_index(headers=ADMIN)}
    assert "simple" in names


def test_http_metadata(restricted_server):
    c = httpclient.InferenceServerClient(restricted_server.http_url)
    with pytest.raises(InferenceServerException,
                       match="This API is restricted, expecting header 'infer-key'"):
        c.get_server_metadata()
    with pytest.raises(InferenceServerException, match="This API is restricted"):
        c.get_model_metadata("simple", headers={"infer-key": "wrong"})
    assert c.get_server_metadata(headers=INFER)["name"] == "triton"
    assert c.get_model_metadata("simple", headers=INFER)["name"] == "simple"


def test_http_infer(restricted_server):
    c = httpclient.InferenceServerClient(restricted_server.http_url)
    with pytest.raises(InferenceServerException, match="This API is restricted"):
        c.infer("simple", _simple_inputs(httpclient), headers={"test": "1"})
    result = c.infer("simple", _simple_inputs(httpclient), headers=INFER)
    assert result.as_numpy("OUTPUT0").tolist() == [list(range(1, 17))]


def _grpc_refused(call, header):
    with pytest.raises(InferenceServerException) as e:
        call()
    assert e.value.status() == "StatusCode.UNAVAILABLE"
    assert e.value.message() == f"This protocol is restricted, expecting header '{header}'"


def test_grpc_health_and_repository_need_the_admin_metadata(restricted_server):
    c = grpcclient.InferenceServerClient(restricted_server.grpc_url)
    _grpc_refused(c.is_server_live, "triton-grpc-protocol-admin-key")
    _grpc_refused(lambda: c.is_model_ready("simple", headers=GRPC_INFER),
                  "triton-grpc-protocol-admin-key")
    # The key without Triton's prefix opens nothing.
    _grpc_refused(lambda: c.is_server_ready(headers=ADMIN), "triton-grpc-protocol-admin-key")
    assert c.is_server_live(headers=GRPC_ADMIN)
    assert c.is_model_ready("simple", headers=GRPC_ADMIN)
    _grpc_refused(c.get_model_repository_index, "triton-grpc-protocol-admin-key")
    index = c.get_model_repository_index(headers=GRPC_ADMIN, as_json=True)
    assert any(m["name"] == "simple" for m in index["models"])


def test_grpc_unrestricted_protocols_are_open(restricted_server):
    c = grpcclient.InferenceServerClient(restricted_server.grpc_url)
    c.get_inference_statistics("simple")
    assert c.get_model_config("simple").config.name == "simple"


def test_grpc_metadata_and_infer(restricted_server):
    c = grpcclient.InferenceServerClient(restricted_server.grpc_url)
    _grpc_refused(c.get_server_metadata, "triton-grpc-protocol-infer-key")
    assert c.get_server_metadata(headers=GRPC_INFER).name == "triton"
    _grpc_refused(lambda: c.infer("simple", _simple_inputs(grpcclient)),
                  "triton-grpc-protocol-infer-key")
    _grpc_refused(lambda: c.infer("simple", _simple_inputs(grpcclient),
                                  headers={"triton-grpc-protocol-infer-key": "infer-valuE"}),
                  "triton-grpc-protocol-infer-key")
    result = c.infer("simple", _simple_inputs(grpcclient), headers=GRPC_INFER)
    assert result.as_numpy("OUTPUT0").tolist() == [list(range(1, 17))]


def _stream_once(url, headers):
    """One request on a ModelStreamInfer stream: (result, error)."""
    answers = queue.Queue()
    c = grpcclient.InferenceServerClient(url)
    c.start_stream(callback=lambda result, error: answers.put((result, error)),
                   headers=headers)
    try:
        try:
            c.async_stream_infer("simple", _simple_inputs(grpcclient))
        except InferenceServerException:
            # A refused stream is answered at once, before any request: when
            # the refusal reaches the client first, it has gone to the
            # callback and the client will not enqueue on the dead stream.
            pass
        return answers.get(timeout=30)
    finally:
        c.stop_stream()


def test_grpc_stream_infer(restricted_server):
    result, error = _stream_once(restricted_server.grpc_url, None)
    assert result is None
    assert error.status() == "StatusCode.UNAVAILABLE"
    assert "This protocol is restricted, expecting header " \
           "'triton-grpc-protocol-infer-key'" in error.message()
    result, error = _stream_once(restricted_server.grpc_url, GRPC_INFER)
    assert error is None, error
    assert result.as_numpy("OUTPUT0").tolist() == [list(range(1, 17))]


LIMIT = 1 << 20


@pytest.fixture(scope="module")
def limited_server():
    server = ServerProcess([ROOT / "models"], ["--grpc-max-message-size", str(LIMIT)],
                           log="python-grpc-limit-server.log", cores=1)
    yield server
    server.stop_expecting_success()


def _identity_input(payload):
    data = np.array([[payload]], dtype=np.object_)
    inp = grpcclient.InferInput("INPUT0", list(data.shape), np_to_triton_dtype(data.dtype))
    inp.set_data_from_numpy(data)
    return [inp]


@pytest.mark.parametrize("compression", [None, "gzip", "deflate"])
def test_grpc_oversized_message_is_resource_exhausted(limited_server, compression):
    c = grpcclient.InferenceServerClient(limited_server.grpc_url)
    # Random bytes: compressed, still over the limit.
    big = np.random.default_rng(0).bytes(2 * LIMIT)
    with pytest.raises(InferenceServerException) as e:
        c.infer("simple_identity", _identity_input(big), compression_algorithm=compression)
    assert e.value.status() == "StatusCode.RESOURCE_EXHAUSTED", e.value
    # The server goes on serving.
    small = b"x" * 1000
    result = c.infer("simple_identity", _identity_input(small),
                     compression_algorithm=compression)
    assert result.as_numpy("OUTPUT0")[0][0] == small


def test_grpc_oversized_stream_message_is_resource_exhausted(limited_server):
    answers = queue.Queue()
    c = grpcclient.InferenceServerClient(limited_server.grpc_url)
    c.start_stream(callback=lambda result, error: answers.put((result, error)))
    try:
        c.async_stream_infer("simple_identity",
                             _identity_input(np.random.default_rng(1).bytes(2 * LIMIT)))
        errors = []
        while not any(e is not None and e.status() == "StatusCode.RESOURCE_EXHAUSTED"
                      for e in errors):
            _, error = answers.get(timeout=30)
            errors.append(error)
    finally:
        c.stop_stream()
