"""ONNX Runtime models through the official tritonclient: the `simple`
contract (INT32 wrap-around), and the MLP behind the dynamic batcher under
concurrent async gRPC requests."""

import asyncio

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.grpc.aio as grpcaio
import tritonclient.http as httpclient


def test_simple_onnx_http_and_grpc(server):
    a = np.array([[2**31 - 1] + list(range(15))], dtype=np.int32)
    b = np.ones((1, 16), dtype=np.int32)
    for module, url in ((httpclient, server.http_url), (grpcclient, server.grpc_url)):
        client = module.InferenceServerClient(url)
        inputs = [module.InferInput("INPUT0", [1, 16], "INT32"), module.InferInput("INPUT1", [1, 16], "INT32")]
        inputs[0].set_data_from_numpy(a)
        inputs[1].set_data_from_numpy(b)
        result = client.infer("simple_onnx", inputs)
        out0 = result.as_numpy("OUTPUT0")
        assert out0[0, 0] == -(2**31), "INT32 wraps around as ONNX Add does"
        np.testing.assert_array_equal(out0[0, 1:], a[0, 1:] + 1)
        np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - b)
        meta = client.get_model_metadata("simple_onnx")
        platform = meta["platform"] if isinstance(meta, dict) else meta.platform
        assert platform == "onnxruntime_onnx"
        client.close()


@pytest.mark.asyncio
async def test_mlp_dynamic_batching_with_concurrent_grpc_requests(server):
    client = grpcaio.InferenceServerClient(server.grpc_url)
    rng = np.random.default_rng(7)
    xs = [rng.standard_normal((1, 256)).astype(np.float32) for _ in range(24)]

    async def one(x):
        inp = grpcaio.InferInput("INPUT0", [1, 256], "FP32")
        inp.set_data_from_numpy(x)
        return (await client.infer("mlp_onnx_dyna", [inp])).as_numpy("OUTPUT0")

    batched = await asyncio.gather(*(one(x) for x in xs))
    before = await client.get_inference_statistics("mlp_onnx_dyna", as_json=True)
    # The same inputs one by one through the unbatched model give the same rows.
    for x, got in zip(xs[:4], batched[:4]):
        inp = grpcaio.InferInput("INPUT0", [1, 256], "FP32")
        inp.set_data_from_numpy(x)
        alone = (await client.infer("mlp_onnx", [inp])).as_numpy("OUTPUT0")
        np.testing.assert_allclose(got, alone, rtol=1e-4, atol=1e-5)
    stats = before["model_stats"][0]
    assert int(stats["inference_count"]) >= 24
    assert int(stats["execution_count"]) < int(stats["inference_count"]), stats
    await client.close()
