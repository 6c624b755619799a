"""A system shared memory region whose object the client truncates after
registering it, as tritonclient's users would: the inference that names it
fails with an error naming the region (Triton dies of SIGBUS instead), the
server keeps serving other regions, and unregistering the broken region
works. Truncation while a model runs is in tests/shm_truncation.rs."""

import os
import queue

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
import tritonclient.utils.shared_memory as shm
from tritonclient.utils import InferenceServerException, serialize_byte_tensor, serialized_byte_size

PAGE = 4096
A = np.arange(16, dtype=np.int32).reshape(1, 16)
B = np.full((1, 16), 3, dtype=np.int32)


class Region:
    """A POSIX shm region created through tritonclient, removed at exit;
    its tensors on the second page, so that halving the object drops them."""

    count = 0

    def __init__(self, size=2 * PAGE):
        Region.count += 1
        self.name = f"trunc_{os.getpid()}_{Region.count}"
        self.key = f"/{self.name}"
        self.handle = shm.create_shared_memory_region(self.name, self.key, size)
        self.size = size

    def truncate(self, size):
        fd = os.open(f"/dev/shm{self.key}", os.O_RDWR)
        try:
            os.ftruncate(fd, size)
        finally:
            os.close(fd)

    def close(self):
        shm.destroy_shared_memory_region(self.handle)


@pytest.fixture
def regions():
    made = []

    def make(size=2 * PAGE):
        r = Region(size)
        made.append(r)
        return r

    yield make
    for r in made:
        r.close()


def client(server, proto):
    if proto == "http":
        return httpclient, httpclient.InferenceServerClient(server.http_url)
    return grpcclient, grpcclient.InferenceServerClient(server.grpc_url)


def infer(module, c, region_in, region_out=None):
    """`simple` with both inputs from `region_in` (page 2), and both
    outputs into `region_out` (page 2) when given."""
    i0 = module.InferInput("INPUT0", [1, 16], "INT32")
    i0.set_shared_memory(region_in.name, 64, offset=PAGE)
    i1 = module.InferInput("INPUT1", [1, 16], "INT32")
    i1.set_shared_memory(region_in.name, 64, offset=PAGE + 64)
    outputs = None
    if region_out is not None:
        outputs = []
        for k, name in enumerate(["OUTPUT0", "OUTPUT1"]):
            o = module.InferRequestedOutput(name)
            o.set_shared_memory(region_out.name, 64, offset=PAGE + 64 * k)
            outputs.append(o)
    return c.infer("simple", [i0, i1], outputs=outputs)


def fill(region):
    shm.set_shared_memory_region(region.handle, [A], offset=PAGE)
    shm.set_shared_memory_region(region.handle, [B], offset=PAGE + 64)


def assert_fails_naming(call, region):
    with pytest.raises(InferenceServerException) as e:
        call()
    text = str(e.value)
    assert f"shared memory region '{region.name}' is unusable" in text and "truncated" in text, text


@pytest.mark.parametrize("proto", ["http", "grpc"])
@pytest.mark.parametrize("size", [0, PAGE], ids=["to_zero", "to_half"])
def test_truncated_input_region(server, regions, proto, size):
    module, c = client(server, proto)
    broken, spare, out = regions(), regions(), regions()
    for r in (broken, spare):
        fill(r)
    for r in (broken, spare, out):
        c.register_system_shared_memory(r.name, r.key, r.size)
    try:
        infer(module, c, broken, out)
        np.testing.assert_array_equal(
            shm.get_contents_as_numpy(out.handle, np.int32, [1, 16], offset=PAGE), A + B)
        broken.truncate(size)
        assert_fails_naming(lambda: infer(module, c, broken), broken)
        assert_fails_naming(lambda: infer(module, c, broken, out), broken)
        # Other regions, and requests without shared memory, still serve.
        infer(module, c, spare, out)
        np.testing.assert_array_equal(
            shm.get_contents_as_numpy(out.handle, np.int32, [1, 16], offset=PAGE + 64), A - B)
        i0 = module.InferInput("INPUT0", [1, 16], "INT32")
        i0.set_data_from_numpy(A)
        i1 = module.InferInput("INPUT1", [1, 16], "INT32")
        i1.set_data_from_numpy(B)
        np.testing.assert_array_equal(c.infer("simple", [i0, i1]).as_numpy("OUTPUT0"), A + B)
        # Restored, it stays broken until registered again.
        broken.truncate(broken.size)
        fill(broken)
        assert_fails_naming(lambda: infer(module, c, broken), broken)
        c.unregister_system_shared_memory(broken.name)
        c.register_system_shared_memory(broken.name, broken.key, broken.size)
        infer(module, c, broken, out)
    finally:
        for r in (broken, spare, out):
            c.unregister_system_shared_memory(r.name)
    assert server.proc.poll() is None


@pytest.mark.parametrize("proto", ["http", "grpc"])
@pytest.mark.parametrize("size", [0, PAGE], ids=["to_zero", "to_half"])
def test_truncated_output_region(server, regions, proto, size):
    module, c = client(server, proto)
    source, broken, spare = regions(), regions(), regions()
    fill(source)
    for r in (source, broken, spare):
        c.register_system_shared_memory(r.name, r.key, r.size)
    try:
        broken.truncate(size)
        assert_fails_naming(lambda: infer(module, c, source, broken), broken)
        infer(module, c, source, spare)
        np.testing.assert_array_equal(
            shm.get_contents_as_numpy(spare.handle, np.int32, [1, 16], offset=PAGE), A + B)
        c.unregister_system_shared_memory(broken.name)
        assert broken.name not in str(c.get_system_shared_memory_status())
    finally:
        for r in (source, spare):
            c.unregister_system_shared_memory(r.name)
    assert server.proc.poll() is None


def test_truncated_output_region_on_the_grpc_stream(server, regions):
    c = grpcclient.InferenceServerClient(server.grpc_url)
    source, broken = regions(), regions()
    fill(source)
    for r in (source, broken):
        c.register_system_shared_memory(r.name, r.key, r.size)
    answers = queue.Queue()
    c.start_stream(callback=lambda result, error: answers.put((result, error)))
    try:
        broken.truncate(0)
        i0 = grpcclient.InferInput("INPUT0", [1, 16], "INT32")
        i0.set_shared_memory(source.name, 64, offset=PAGE)
        i1 = grpcclient.InferInput("INPUT1", [1, 16], "INT32")
        i1.set_shared_memory(source.name, 64, offset=PAGE + 64)
        o0 = grpcclient.InferRequestedOutput("OUTPUT0")
        o0.set_shared_memory(broken.name, 64, offset=PAGE)
        c.async_stream_infer("simple", [i0, i1], outputs=[o0], request_id="t1")
        result, error = answers.get(timeout=10)
        assert error is not None and f"'{broken.name}' is unusable" in str(error), error
        # The stream stays open.
        c.async_stream_infer("simple", [i0, i1], request_id="t2")
        result, error = answers.get(timeout=10)
        assert error is None, error
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), A + B)
    finally:
        c.stop_stream()
        for r in (source, broken):
            c.unregister_system_shared_memory(r.name)


@pytest.mark.parametrize("proto", ["http", "grpc"])
def test_truncated_bytes_input_within_the_last_page(server, regions, proto):
    # BYTES are parsed when the request is decoded: a shrink that cuts the
    # serialized strings (zeros past the new end, no fault) names the
    # region rather than reporting malformed data.
    module, c = client(server, proto)
    data = np.array([[b"x" * 100, b"y" * 100]], dtype=np.object_)
    ser = serialize_byte_tensor(data)
    size = serialized_byte_size(ser)
    r = regions(size)
    shm.set_shared_memory_region(r.handle, [ser])
    c.register_system_shared_memory(r.name, r.key, size)
    try:
        i = module.InferInput("INPUT0", [1, 2], "BYTES")
        i.set_shared_memory(r.name, size)
        c.infer("simple_identity", [i])
        r.truncate(size // 2)
        assert_fails_naming(lambda: c.infer("simple_identity", [i]), r)
    finally:
        c.unregister_system_shared_memory(r.name)
