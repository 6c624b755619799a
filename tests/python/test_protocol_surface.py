"""The protocol surface beyond inference, as tritonclient sees it: server
identity, Triton's error texts, classification, gRPC compression, system
shared memory (and CUDA shared memory refused as Triton without a GPU
refuses it), and Triton's own client examples for these, run unchanged."""

import os
import queue
import pathlib
import re
import subprocess
import sys
import threading
import time
import urllib.request

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
import tritonclient.utils.shared_memory as shm
from tritonclient.utils import InferenceServerException, serialize_byte_tensor, serialized_byte_size

from helpers import simple_inputs

EXAMPLES = pathlib.Path(__file__).resolve().parent / "examples"

# script -> (protocol, extra arguments)
SURFACE_EXAMPLES = {
    "simple_http_shm_client.py": ("http", []),
    "simple_grpc_shm_client.py": ("grpc", []),
    "simple_http_shm_string_client.py": ("http", []),
    "simple_grpc_shm_string_client.py": ("grpc", []),
    "reuse_infer_objects_client.py": ("http", ["-i", "http"]),
    "simple_http_health_metadata.py": ("http", []),
    "simple_grpc_health_metadata.py": ("grpc", []),
    "grpc_explicit_int8_content_client.py": ("grpc", []),
    "simple_grpc_infer_client.py": ("grpc", []),
    "simple_http_infer_client.py": ("http", []),
}
CASES = [(s, []) for s in SURFACE_EXAMPLES] + [
    ("reuse_infer_objects_client.py#grpc", ["-i", "grpc"]),
    ("simple_grpc_infer_client.py#gzip", ["-C", "gzip"]),
    ("simple_grpc_infer_client.py#deflate", ["-C", "deflate"]),
]


@pytest.mark.parametrize("case,extra", CASES)
def test_triton_example(server, case, extra):
    script = case.split("#")[0]
    proto, default_extra = SURFACE_EXAMPLES[script]
    extra = extra or default_extra
    url = server.grpc_url if proto == "grpc" or "grpc" in extra else server.http_url
    cmd = [sys.executable, str(EXAMPLES / script), "-u", url] + extra
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=EXAMPLES,
                       env={**os.environ, "PYTHONUNBUFFERED": "1"})
    out = p.stdout + p.stderr
    assert p.returncode == 0, out
    # Those that print a verdict print PASS; the others signal failure by exit code.
    if "PASS" in (EXAMPLES / script).read_text():
        assert re.search(r"^PASS", p.stdout, re.M), out


# ---------------------------------------------------------------- identity

def test_server_identity_http(server):
    meta = httpclient.InferenceServerClient(server.http_url).get_server_metadata()
    assert meta["name"] == "triton"
    assert meta["version"].startswith("shardserve-")
    assert "system_shared_memory" in meta["extensions"]
    # cuda_shared_memory is listed only where a GPU is usable; test_cuda_shm.py
    # checks the answers on each side of that.
    with urllib.request.urlopen(f"http://{server.http_url}/v2/health/live") as r:
        assert r.headers["Server"].startswith("shardserve/")


def test_server_identity_grpc(server):
    meta = grpcclient.InferenceServerClient(server.grpc_url).get_server_metadata()
    assert meta.name == "triton"
    assert meta.version.startswith("shardserve-")
    assert "classification" in meta.extensions


# ---------------------------------------------------------------- error texts

def test_bad_version_string_http(server):
    c = httpclient.InferenceServerClient(server.http_url)
    inputs, _, _ = simple_inputs(httpclient)
    with pytest.raises(InferenceServerException) as e:
        c.infer("simple", inputs, model_version="wrong_specification")
    assert "failed to get model version from specified version string 'wrong_specification'" in str(e.value)


def test_bad_version_string_grpc(server):
    c = grpcclient.InferenceServerClient(server.grpc_url)
    inputs, _, _ = simple_inputs(grpcclient)
    with pytest.raises(InferenceServerException) as e:
        c.infer("simple", inputs, model_version="-3")
    assert "invalid model version specified '-3'" in str(e.value)
    assert e.value.status() == "StatusCode.INVALID_ARGUMENT"


# ---------------------------------------------------------------- classification

@pytest.mark.parametrize("proto", ["http", "grpc"])
def test_classification_batched(server, proto):
    module = httpclient if proto == "http" else grpcclient
    url = server.http_url if proto == "http" else server.grpc_url
    c = module.InferenceServerClient(url)
    inputs, a, b = simple_inputs(module, batch=2)
    outputs = [module.InferRequestedOutput("OUTPUT0", class_count=3)]
    r = c.infer("simple", inputs, outputs=outputs)
    got = r.as_numpy("OUTPUT0")
    assert got.shape == (2, 3)
    # OUTPUT0 = a + b = 1..16 per row: the top three are 16, 15, 14 at 15, 14, 13.
    for row in got:
        assert [x.decode() for x in row] == ["16:15", "15:14", "14:13"]


# ---------------------------------------------------------------- compression

@pytest.mark.parametrize("algorithm", ["gzip", "deflate"])
def test_grpc_compression(server, algorithm):
    c = grpcclient.InferenceServerClient(server.grpc_url)
    inputs, a, b = simple_inputs(grpcclient)
    r = c.infer("simple", inputs, compression_algorithm=algorithm)
    np.testing.assert_array_equal(r.as_numpy("OUTPUT0"), a + b)


@pytest.mark.parametrize("algorithm", ["gzip", "deflate"])
def test_grpc_stream_compression(server, algorithm):
    """The stream's messages are read as bytes by the server's own route
    (stream_route.rs); tonic still decompresses them first."""
    c = grpcclient.InferenceServerClient(server.grpc_url)
    got = queue.Queue()
    inputs, a, b = simple_inputs(grpcclient)
    try:
        c.start_stream(callback=lambda result, error: got.put((result, error)),
                       compression_algorithm=algorithm)
        for i in range(3):
            c.async_stream_infer("simple", inputs, request_id=str(i))
        for _ in range(3):
            result, error = got.get(timeout=30)
            assert error is None, error
            np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)
    finally:
        c.stop_stream()
        c.close()


# ---------------------------------------------------------------- shared memory

class Region:
    """A POSIX shm region created through tritonclient, removed at exit."""

    count = 0

    def __init__(self, size):
        Region.count += 1
        self.name = f"pst_{os.getpid()}_{Region.count}"
        self.key = f"/{self.name}"
        self.handle = shm.create_shared_memory_region(self.name, self.key, size)
        self.size = size

    def close(self):
        shm.destroy_shared_memory_region(self.handle)


@pytest.fixture
def regions():
    made = []

    def make(size):
        r = Region(size)
        made.append(r)
        return r

    yield make
    for r in made:
        r.close()


def clients(server):
    return [
        (httpclient, httpclient.InferenceServerClient(server.http_url)),
        (grpcclient, grpcclient.InferenceServerClient(server.grpc_url)),
    ]


@pytest.mark.parametrize("proto", ["http", "grpc"])
def test_shm_inputs_and_outputs_with_offsets(server, regions, proto):
    module, c = clients(server)[0 if proto == "http" else 1]
    a = np.arange(16, dtype=np.int32).reshape(1, 16)
    b = np.full((1, 16), 3, dtype=np.int32)
    region_in = regions(8192)
    region_out = regions(256)
    # Registered at an offset that is not page-aligned; tensors at offsets
    # relative to the registered start.
    base = 4096 + 8
    shm.set_shared_memory_region(region_in.handle, [a], offset=base)
    shm.set_shared_memory_region(region_in.handle, [b], offset=base + 64)
    c.register_system_shared_memory(region_in.name, region_in.key, 128, offset=base)
    c.register_system_shared_memory(region_out.name, region_out.key, 256)
    try:
        i0 = module.InferInput("INPUT0", [1, 16], "INT32")
        i0.set_shared_memory(region_in.name, 64, offset=0)
        i1 = module.InferInput("INPUT1", [1, 16], "INT32")
        i1.set_shared_memory(region_in.name, 64, offset=64)
        o0 = module.InferRequestedOutput("OUTPUT0")
        o0.set_shared_memory(region_out.name, 64)
        o1 = module.InferRequestedOutput("OUTPUT1")
        o1.set_shared_memory(region_out.name, 64, offset=128)
        r = c.infer("simple", [i0, i1], outputs=[o0, o1])
        out0 = shm.get_contents_as_numpy(region_out.handle, np.int32, [1, 16])
        out1 = shm.get_contents_as_numpy(region_out.handle, np.int32, [1, 16], offset=128)
        np.testing.assert_array_equal(out0, a + b)
        np.testing.assert_array_equal(out1, a - b)
        # As from Triton: datatype and shape, the data only in the region.
        out = r.get_output("OUTPUT0")
        if proto == "http":
            assert out["datatype"] == "INT32" and out["shape"] == [1, 16] and "data" not in out
        else:
            assert out.datatype == "INT32" and list(out.shape) == [1, 16]
            assert r.get_response().raw_output_contents[0] == b""
        status = c.get_system_shared_memory_status(region_in.name)
        if proto == "http":
            assert status == [{"name": region_in.name, "key": region_in.key, "offset": base, "byte_size": 128}]
        else:
            assert status.regions[region_in.name].byte_size == 128
    finally:
        c.unregister_system_shared_memory(region_in.name)
        c.unregister_system_shared_memory(region_out.name)


def test_shm_outputs_on_the_grpc_stream(server, regions):
    import queue

    c = grpcclient.InferenceServerClient(server.grpc_url)
    region_out = regions(128)
    c.register_system_shared_memory(region_out.name, region_out.key, 128)
    answers = queue.Queue()
    c.start_stream(callback=lambda result, error: answers.put((result, error)))
    try:
        a = np.arange(16, dtype=np.int32).reshape(1, 16)
        i0 = grpcclient.InferInput("INPUT0", [1, 16], "INT32")
        i0.set_data_from_numpy(a)
        i1 = grpcclient.InferInput("INPUT1", [1, 16], "INT32")
        i1.set_data_from_numpy(a)
        o0 = grpcclient.InferRequestedOutput("OUTPUT0")
        o0.set_shared_memory(region_out.name, 64)
        c.async_stream_infer("simple", [i0, i1], outputs=[o0], request_id="s1")
        result, error = answers.get(timeout=10)
        assert error is None, error
        assert result.get_response().raw_output_contents[0] == b""
        out0 = shm.get_contents_as_numpy(region_out.handle, np.int32, [1, 16])
        np.testing.assert_array_equal(out0, a + a)
        # An unknown region is an error on the stream, which stays open.
        o0.set_shared_memory("no_such_region", 64)
        c.async_stream_infer("simple", [i0, i1], outputs=[o0], request_id="s2")
        result, error = answers.get(timeout=10)
        assert error is not None and "no_such_region" in str(error)
    finally:
        c.stop_stream()
        c.unregister_system_shared_memory(region_out.name)


def test_shm_string_tensors(server, regions):
    c = grpcclient.InferenceServerClient(server.grpc_url)
    a = np.array([[str(i).encode() for i in range(16)]], dtype=np.object_)
    b = np.array([[b"1"] * 16], dtype=np.object_)
    sa, sb = serialize_byte_tensor(a), serialize_byte_tensor(b)
    na, nb = serialized_byte_size(sa), serialized_byte_size(sb)
    ra = regions(na)
    rb = regions(nb)
    shm.set_shared_memory_region(ra.handle, [sa])
    shm.set_shared_memory_region(rb.handle, [sb])
    c.register_system_shared_memory(ra.name, ra.key, na)
    c.register_system_shared_memory(rb.name, rb.key, nb)
    try:
        i0 = grpcclient.InferInput("INPUT0", [1, 16], "BYTES")
        i0.set_shared_memory(ra.name, na)
        i1 = grpcclient.InferInput("INPUT1", [1, 16], "BYTES")
        i1.set_shared_memory(rb.name, nb)
        r = c.infer("simple_string", [i0, i1])
        assert [int(x) for x in r.as_numpy("OUTPUT0")[0]] == [i + 1 for i in range(16)]
    finally:
        c.unregister_system_shared_memory()


@pytest.mark.parametrize("proto", ["http", "grpc"])
def test_shm_errors(server, regions, proto):
    module, c = clients(server)[0 if proto == "http" else 1]
    region = regions(128)
    c.register_system_shared_memory(region.name, region.key, 128)
    try:
        # Duplicate name.
        with pytest.raises(InferenceServerException) as e:
            c.register_system_shared_memory(region.name, region.key, 128)
        assert f"shared memory region '{region.name}' already in manager" in str(e.value)
        # A key nobody created.
        with pytest.raises(InferenceServerException) as e:
            c.register_system_shared_memory("nokey", "/no_such_shm_key_here", 64)
        assert "Unable to open shared memory region: '/no_such_shm_key_here'" in str(e.value)
        # Registration beyond the object.
        with pytest.raises(InferenceServerException) as e:
            c.register_system_shared_memory("toolarge", region.key, 64, offset=100)
        assert "failed to register shared memory region 'toolarge': invalid args" in str(e.value)
        # Unknown region status.
        with pytest.raises(InferenceServerException) as e:
            c.get_system_shared_memory_status("nosuch")
        assert "Unable to find system shared memory region: 'nosuch'" in str(e.value)

        def infer_with(region_name, offset, size, out_size=None):
            i0 = module.InferInput("INPUT0", [1, 16], "INT32")
            i0.set_shared_memory(region_name, size, offset=offset)
            i1 = module.InferInput("INPUT1", [1, 16], "INT32")
            i1.set_shared_memory(region_name, size, offset=offset)
            outputs = None
            if out_size is not None:
                o = module.InferRequestedOutput("OUTPUT0")
                o.set_shared_memory(region_name, out_size)
                outputs = [o]
            return c.infer("simple", [i0, i1], outputs=outputs)

        with pytest.raises(InferenceServerException) as e:
            infer_with("nosuch", 0, 64)
        assert "Unable to find shared memory region: 'nosuch'" in str(e.value)
        with pytest.raises(InferenceServerException) as e:
            infer_with(region.name, 128, 64)
        assert f"Invalid offset for shared memory region: '{region.name}'" in str(e.value)
        with pytest.raises(InferenceServerException) as e:
            infer_with(region.name, 100, 64)
        assert f"Invalid offset + byte size for shared memory region: '{region.name}'" in str(e.value)
        with pytest.raises(InferenceServerException) as e:
            infer_with(region.name, 0, 60)
        assert ("input byte size mismatch for input 'INPUT0' for model 'simple'. "
                "Expected 64, got 60") in str(e.value)
        with pytest.raises(InferenceServerException) as e:
            infer_with(region.name, 0, 64, out_size=32)
        assert ("shared memory size specified with the request for output 'OUTPUT0' (32 bytes) "
                "should be at least 64 bytes to hold the results") in str(e.value)
        # Unregistering an unknown name is not an error (Triton's behaviour).
        c.unregister_system_shared_memory("nosuch")
        # The server keeps serving.
        inputs, a, b = simple_inputs(module)
        np.testing.assert_array_equal(c.infer("simple", inputs).as_numpy("OUTPUT0"), a + b)
    finally:
        c.unregister_system_shared_memory()
    assert len(c.get_system_shared_memory_status()) == 0 if proto == "http" else \
        len(c.get_system_shared_memory_status().regions) == 0


def test_unregister_while_requests_use_the_region(server, regions):
    """Many requests read a region while another client unregisters and
    re-registers it: each request succeeds with the right answer or fails
    with 'Unable to find shared memory region'; every unregister succeeds (as
    in Triton, one while a request holds the region completes after it), and
    a register while the previous one still waits gets 'already in manager';
    once every answer is in, the region is gone; the server keeps serving."""
    a = np.arange(16, dtype=np.int32).reshape(1, 16)
    region = regions(64)
    shm.set_shared_memory_region(region.handle, [a])
    admin = httpclient.InferenceServerClient(server.http_url)
    admin.register_system_shared_memory(region.name, region.key, 64)
    stop = threading.Event()
    failures = []
    counts = {"ok": 0, "missing": 0}

    def worker():
        c = grpcclient.InferenceServerClient(server.grpc_url)
        while not stop.is_set():
            i0 = grpcclient.InferInput("INPUT0", [1, 16], "INT32")
            i0.set_shared_memory(region.name, 64)
            i1 = grpcclient.InferInput("INPUT1", [1, 16], "INT32")
            i1.set_shared_memory(region.name, 64)
            try:
                r = c.infer("simple", [i0, i1])
                if not np.array_equal(r.as_numpy("OUTPUT0"), a + a):
                    failures.append("wrong answer")
                counts["ok"] += 1
            except InferenceServerException as e:
                if "Unable to find shared memory region" in str(e):
                    counts["missing"] += 1
                else:
                    failures.append(str(e))

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for t in threads:
        t.start()
    for _ in range(200):
        try:
            admin.unregister_system_shared_memory(region.name)
        except InferenceServerException as e:
            failures.append(str(e))
        try:
            admin.register_system_shared_memory(region.name, region.key, 64)
        except InferenceServerException as e:
            # The unregister waits for a request still using the region.
            if f"shared memory region '{region.name}' already in manager" not in str(e):
                failures.append(str(e))
    stop.set()
    for t in threads:
        t.join()
    # Every request has been answered, and a request lets go of its regions
    # before its answer is sent: the last unregister has completed.
    admin.unregister_system_shared_memory(region.name)
    with pytest.raises(InferenceServerException) as e:
        admin.get_system_shared_memory_status(region.name)
    assert f"Unable to find system shared memory region: '{region.name}'" in str(e.value)
    assert not failures, failures[:5]
    assert counts["ok"] > 0
    assert admin.is_server_live()


@pytest.mark.parametrize("proto", ["http", "grpc"])
def test_cuda_shm_answers_as_triton_without_gpu(server, proto):
    module, c = clients(server)[0 if proto == "http" else 1]
    meta = httpclient.InferenceServerClient(server.http_url).get_server_metadata()
    if "cuda_shared_memory" in meta["extensions"]:
        print("SKIPPED: the server can use a GPU; the no-GPU answers do not apply", file=sys.stderr)
        pytest.skip("the server can use a GPU; the no-GPU answers do not apply")
    with pytest.raises(InferenceServerException) as e:
        c.register_cuda_shared_memory("cu", b"\x00" * 64, 0, 64)
    assert "failed to register CUDA shared memory region: 'cu', GPUs not supported" in str(e.value)
    status = c.get_cuda_shared_memory_status()
    assert (status == []) if proto == "http" else (len(status.regions) == 0)
    with pytest.raises(InferenceServerException) as e:
        c.get_cuda_shared_memory_status("cu")
    assert "Unable to find cuda shared memory region: 'cu'" in str(e.value)
    c.unregister_cuda_shared_memory("cu")
    c.unregister_cuda_shared_memory()


# ---------------------------------------------------------------- logging

def test_logging_extension_both_protocols(server):
    h = httpclient.InferenceServerClient(server.http_url)
    g = grpcclient.InferenceServerClient(server.grpc_url)
    before = h.get_log_settings()
    assert set(before) == {"log_file", "log_info", "log_warning", "log_error", "log_verbose_level", "log_format"}
    try:
        after = h.update_log_settings({"log_verbose_level": 1})
        assert after["log_verbose_level"] == 1
        got = g.get_log_settings(as_json=True)["settings"]
        assert got["log_verbose_level"]["uint32_param"] == 1
        got = g.update_log_settings({"log_warning": False}, as_json=True)["settings"]
        assert got["log_warning"]["bool_param"] is False
        assert h.get_log_settings()["log_warning"] is False
        for bad in ({"log_info": 3}, {"log_verbose_level": "high"}, {"log_format": "xml"}):
            with pytest.raises(InferenceServerException):
                h.update_log_settings(bad)
        # As tritonserver 2.51: unknown settings are ignored, the file cannot move.
        assert h.update_log_settings({"no_such_setting": True})["log_verbose_level"] == 1
        with pytest.raises(InferenceServerException) as e:
            h.update_log_settings({"log_file": "/tmp/elsewhere.log"})
        assert "can not be updated through network protocol" in str(e.value)
        # A refused change changes nothing.
        assert h.get_log_settings()["log_verbose_level"] == 1
    finally:
        h.update_log_settings({"log_verbose_level": before["log_verbose_level"], "log_warning": True})
