"""gRPC ModelStreamInfer with tritonclient: the sync client's
start_stream / async_stream_infer and the aio client's stream_infer, for
the non-decoupled `simple` model."""

import queue

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.grpc.aio as grpcaio

from helpers import simple_inputs

TIMEOUT_S = 30


def _inputs(module, b):
    """`simple`'s inputs: INPUT0 = 0..15, INPUT1 = all `b`."""
    inputs, a, _ = simple_inputs(module)
    ones = np.full((1, 16), b, dtype=np.int32)
    inputs[1].set_data_from_numpy(ones)
    return inputs, a, ones


def _unknown_model_inputs(module):
    inputs, _, _ = simple_inputs(module)
    return inputs


def _bad_shape_inputs(module):
    inputs = [module.InferInput("INPUT0", [1, 15], "INT32"), module.InferInput("INPUT1", [1, 15], "INT32")]
    for i in inputs:
        i.set_data_from_numpy(np.zeros((1, 15), dtype=np.int32))
    return inputs


def _collect(responses, n):
    out = []
    for _ in range(n):
        out.append(responses.get(timeout=TIMEOUT_S))
    return out


@pytest.fixture
def client(server):
    c = grpcclient.InferenceServerClient(server.grpc_url)
    yield c
    c.close()


def test_stream_infer_answers_every_request_with_its_id(client):
    responses = queue.Queue()
    client.start_stream(callback=lambda result, error: responses.put((result, error)))
    n = 64
    for i in range(n):
        inputs, _, _ = _inputs(grpcclient, i)
        client.async_stream_infer("simple", inputs, request_id=f"req-{i}")
    got = _collect(responses, n)
    client.stop_stream()
    a = np.arange(16, dtype=np.int32).reshape(1, 16)
    ids = set()
    for result, error in got:
        assert error is None, error
        rid = result.get_response().id
        b = int(rid.split("-")[1])
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)
        np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - b)
        assert "triton_final_response" not in result.get_response().parameters
        ids.add(rid)
    assert ids == {f"req-{i}" for i in range(n)}
    assert responses.empty()


def test_stream_errors_arrive_on_the_stream_and_it_goes_on(client):
    responses = queue.Queue()
    client.start_stream(callback=lambda result, error: responses.put((result, error)))
    inputs, _, _ = _inputs(grpcclient, 1)
    client.async_stream_infer("simple", inputs, request_id="before")
    client.async_stream_infer("no_such_model", _unknown_model_inputs(grpcclient), request_id="unknown")
    client.async_stream_infer("simple", _bad_shape_inputs(grpcclient), request_id="bad-shape")
    inputs, _, _ = _inputs(grpcclient, 2)
    client.async_stream_infer("simple", inputs, request_id="after")
    got = _collect(responses, 4)
    # The stream is still open and serving after the errors.
    inputs, _, _ = _inputs(grpcclient, 3)
    client.async_stream_infer("simple", inputs, request_id="later")
    got += _collect(responses, 1)
    client.stop_stream()

    errors = [str(e) for r, e in got if e is not None]
    ok = {r.get_response().id: r for r, e in got if e is None}
    assert len(errors) == 2, errors
    assert any("Request for unknown model" in e for e in errors), errors
    assert any("INPUT0" in e or "INPUT1" in e for e in errors), errors
    assert sorted(ok) == ["after", "before", "later"]
    a = np.arange(16, dtype=np.int32).reshape(1, 16)
    np.testing.assert_array_equal(ok["later"].as_numpy("OUTPUT0"), a + 3)
    # The client is usable for unary calls afterwards.
    assert client.is_server_ready()


def test_stream_enable_empty_final_response_flags_final_responses(client):
    responses = queue.Queue()
    client.start_stream(callback=lambda result, error: responses.put((result, error)))
    for i in range(4):
        inputs, _, _ = _inputs(grpcclient, i)
        client.async_stream_infer("simple", inputs, request_id=f"f{i}", enable_empty_final_response=True)
    got = _collect(responses, 4)
    client.stop_stream()
    for result, error in got:
        assert error is None, error
        params = result.get_response().parameters
        assert params["triton_final_response"].bool_param is True
        assert result.as_numpy("OUTPUT0") is not None


def test_restarted_stream_on_the_same_client(client):
    for round_ in range(2):
        responses = queue.Queue()
        client.start_stream(callback=lambda result, error: responses.put((result, error)))
        inputs, _, _ = _inputs(grpcclient, round_)
        client.async_stream_infer("simple", inputs, request_id=f"round-{round_}")
        (result, error), = _collect(responses, 1)
        client.stop_stream()
        assert error is None, error
        assert result.get_response().id == f"round-{round_}"


@pytest.mark.asyncio
async def test_aio_stream_infer(server):
    client = grpcaio.InferenceServerClient(server.grpc_url)
    n = 32

    async def requests():
        for i in range(n):
            if i == n // 2:
                yield {
                    "model_name": "no_such_model",
                    "inputs": _unknown_model_inputs(grpcaio),
                    "request_id": "unknown",
                }
            inputs, _, _ = _inputs(grpcaio, i)
            yield {
                "model_name": "simple",
                "inputs": inputs,
                "request_id": f"aio-{i}",
                "parameters": None,
            }

    try:
        results, errors = {}, []
        async for result, error in client.stream_infer(requests(), stream_timeout=TIMEOUT_S):
            if error is not None:
                errors.append(str(error))
                continue
            results[result.get_response().id] = result
        assert len(errors) == 1 and "Request for unknown model" in errors[0], errors
        assert sorted(results) == sorted(f"aio-{i}" for i in range(n))
        a = np.arange(16, dtype=np.int32).reshape(1, 16)
        for i in range(n):
            r = results[f"aio-{i}"]
            np.testing.assert_array_equal(r.as_numpy("OUTPUT0"), a + i)
            np.testing.assert_array_equal(r.as_numpy("OUTPUT1"), a - i)
    finally:
        await client.close()
