"""CUDA shared memory through tritonclient, on both protocols.

Without a GPU (this project's CI machines) the server must answer as
Triton built without GPU support and keep serving. With one, a round trip
through tritonclient.utils.cuda_shared_memory on `simple` and `mlp_onnx`
(outputs compared with the same request sent as plain tensors). Each test
that cannot run here says why: pytest's skip reason, and a line on stderr.

The GPU round trips have never run on this project's machines (no GPU, no
CUDA driver): they are written from tritonclient's documentation and its
own cuda_shared_memory module.
"""

import sys

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
import tritonclient.utils.shared_memory as shm
from tritonclient.utils import InferenceServerException

from helpers import simple_inputs


def clients(server):
    return {
        "http": (httpclient, httpclient.InferenceServerClient(server.http_url)),
        "grpc": (grpcclient, grpcclient.InferenceServerClient(server.grpc_url)),
    }


def cuda_advertised(server):
    meta = httpclient.InferenceServerClient(server.http_url).get_server_metadata()
    return "cuda_shared_memory" in meta["extensions"]


def skip(why):
    print(f"SKIPPED: {why}", file=sys.stderr)
    pytest.skip(why)


@pytest.mark.parametrize("proto", ["http", "grpc"])
def test_without_a_gpu_cuda_shm_answers_as_triton_without_gpu_and_serving_goes_on(server, proto):
    if cuda_advertised(server):
        skip("the server can use a GPU; the no-GPU answers do not apply")
    module, c = clients(server)[proto]
    with pytest.raises(InferenceServerException) as e:
        c.register_cuda_shared_memory("cu_" + proto, b"\x01" * 64, 0, 1024)
    assert str(e.value).endswith(
        f"failed to register CUDA shared memory region: 'cu_{proto}', GPUs not supported"
    ), str(e.value)
    status = c.get_cuda_shared_memory_status()
    assert (status == []) if proto == "http" else (len(status.regions) == 0)

    # A system region's name asked as a CUDA one: Triton's wrong-kind text.
    region = shm.create_shared_memory_region("sys_" + proto, "/cudatest_" + proto, 64)
    try:
        c.register_system_shared_memory("sys_" + proto, "/cudatest_" + proto, 64)
        with pytest.raises(InferenceServerException) as e:
            c.get_cuda_shared_memory_status("sys_" + proto)
        assert (
            f"The region named 'sys_{proto}' is registered as system shared memory, "
            "not CUDA shared memory"
        ) in str(e.value)
        # Unregistering it as CUDA memory leaves the system region alone.
        c.unregister_cuda_shared_memory("sys_" + proto)
        assert c.get_system_shared_memory_status("sys_" + proto)
    finally:
        c.unregister_system_shared_memory("sys_" + proto)
        shm.destroy_shared_memory_region(region)

    # The server serves on.
    inputs, a, b = simple_inputs(module)
    r = c.infer("simple", inputs)
    np.testing.assert_array_equal(r.as_numpy("OUTPUT0"), a + b)


def cudashm_or_skip(server):
    if not cuda_advertised(server):
        skip("no usable GPU: the server does not advertise cuda_shared_memory")
    try:
        import tritonclient.utils.cuda_shared_memory as cudashm
    except (ImportError, RuntimeError) as e:
        skip(f"tritonclient's CUDA shared memory utilities are unavailable: {e}")
    return cudashm


@pytest.mark.parametrize("proto", ["http", "grpc"])
def test_cuda_shm_round_trip_on_simple(server, proto):
    cudashm = cudashm_or_skip(server)
    module, c = clients(server)[proto]
    a = np.arange(16, dtype=np.int32).reshape(1, 16)
    b = np.full((1, 16), 3, dtype=np.int32)
    nbytes = a.nbytes
    in_h = cudashm.create_shared_memory_region(f"cin_{proto}", 2 * nbytes, 0)
    out_h = cudashm.create_shared_memory_region(f"cout_{proto}", 2 * nbytes, 0)
    try:
        cudashm.set_shared_memory_region(in_h, [a, b])
        c.register_cuda_shared_memory(f"cin_{proto}", cudashm.get_raw_handle(in_h), 0, 2 * nbytes)
        c.register_cuda_shared_memory(f"cout_{proto}", cudashm.get_raw_handle(out_h), 0, 2 * nbytes)
        status = c.get_cuda_shared_memory_status(f"cin_{proto}")
        assert status, status
        inputs = [module.InferInput("INPUT0", [1, 16], "INT32"), module.InferInput("INPUT1", [1, 16], "INT32")]
        inputs[0].set_shared_memory(f"cin_{proto}", nbytes, 0)
        inputs[1].set_shared_memory(f"cin_{proto}", nbytes, nbytes)
        outputs = [module.InferRequestedOutput("OUTPUT0"), module.InferRequestedOutput("OUTPUT1")]
        outputs[0].set_shared_memory(f"cout_{proto}", nbytes, 0)
        outputs[1].set_shared_memory(f"cout_{proto}", nbytes, nbytes)
        c.infer("simple", inputs, outputs=outputs)
        out = cudashm.get_contents_as_numpy(out_h, "INT32", [2, 16])
        np.testing.assert_array_equal(out[0], (a + b)[0])
        np.testing.assert_array_equal(out[1], (a - b)[0])
    finally:
        c.unregister_cuda_shared_memory()
        cudashm.destroy_shared_memory_region(in_h)
        cudashm.destroy_shared_memory_region(out_h)


@pytest.mark.parametrize("proto", ["http", "grpc"])
def test_cuda_shm_round_trip_on_mlp_onnx_matches_plain_tensors(server, proto):
    cudashm = cudashm_or_skip(server)
    module, c = clients(server)[proto]
    x = np.random.default_rng(7).standard_normal((4, 256)).astype(np.float32)
    plain = module.InferInput("INPUT0", list(x.shape), "FP32")
    plain.set_data_from_numpy(x)
    expected = c.infer("mlp_onnx", [plain]).as_numpy("OUTPUT0")

    in_h = cudashm.create_shared_memory_region(f"min_{proto}", x.nbytes, 0)
    out_h = cudashm.create_shared_memory_region(f"mout_{proto}", expected.nbytes, 0)
    try:
        cudashm.set_shared_memory_region(in_h, [x])
        c.register_cuda_shared_memory(f"min_{proto}", cudashm.get_raw_handle(in_h), 0, x.nbytes)
        c.register_cuda_shared_memory(
            f"mout_{proto}", cudashm.get_raw_handle(out_h), 0, expected.nbytes
        )
        inp = module.InferInput("INPUT0", list(x.shape), "FP32")
        inp.set_shared_memory(f"min_{proto}", x.nbytes)
        out = module.InferRequestedOutput("OUTPUT0")
        out.set_shared_memory(f"mout_{proto}", expected.nbytes)
        c.infer("mlp_onnx", [inp], outputs=[out])
        got = cudashm.get_contents_as_numpy(out_h, "FP32", list(expected.shape))
        np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)
    finally:
        c.unregister_cuda_shared_memory()
        cudashm.destroy_shared_memory_region(in_h)
        cudashm.destroy_shared_memory_region(out_h)
