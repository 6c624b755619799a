"""The response cache (`--cache-config local,size=N`, `response_cache
{ enable: true }`) over HTTP and gRPC, as Triton 2.51 keeps it: a hit counts
as a success and in `cache_hit`, never in execution or inference counts; a
stored miss counts in `cache_miss`; the key is protocol independent (an HTTP
request hits what gRPC stored); different requests never share an entry; the
cache is bounded with LRU eviction; an ensemble is cached whole; outputs to
shared memory are written on hits; bad settings fail start-up."""

import re
import shutil
import subprocess
import urllib.request

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
import tritonclient.utils.shared_memory as shm

from helpers import simple_inputs
from serverproc import BINARY, ROOT, ServerProcess

CACHE_ON = "\nresponse_cache { enable: true }\n"


def copy_model(src, dst_repo, name=None, cache=True, rename_steps=None):
    dst = dst_repo / (name or src)
    shutil.copytree(ROOT / "models" / src, dst)
    config = (dst / "config.pbtxt").read_text()
    if name:
        config = config.replace(f'name: "{src}"', f'name: "{name}"', 1)
    if rename_steps:
        old, new = rename_steps
        config = config.replace(f'model_name: "{old}"', f'model_name: "{new}"')
    if cache:
        config += CACHE_ON
    (dst / "config.pbtxt").write_text(config)


@pytest.fixture(scope="module")
def cached(tmp_path_factory):
    repo = tmp_path_factory.mktemp("cache_repo")
    copy_model("simple", repo)
    # The ensemble's steps run an uncached copy of `simple`, so every count
    # below is the ensemble's own.
    copy_model("simple", repo, name="simple_nc", cache=False)
    copy_model("simple_ensemble", repo, rename_steps=("simple", "simple_nc"))
    copy_model("simple_int8", repo, cache=False)
    server = ServerProcess([repo], ["--cache-config", "local,size=1048576"],
                           log="response-cache-server.log")
    yield server
    server.stop_expecting_success()


def stats(url, model):
    with httpclient.InferenceServerClient(url) as c:
        s = c.get_inference_statistics(model)["model_stats"][0]
    i = s["inference_stats"]
    return {
        "success": i["success"]["count"],
        "hit": i["cache_hit"]["count"],
        "miss": i["cache_miss"]["count"],
        "hit_ns": i["cache_hit"]["ns"],
        "miss_ns": i["cache_miss"]["ns"],
        "queue": i["queue"]["count"],
        "exec": s["execution_count"],
        "inf": s["inference_count"],
    }


def metric(server, name, model):
    with urllib.request.urlopen(f"http://{server.metrics_url}/metrics", timeout=10) as r:
        text = r.read().decode()
    m = re.search(rf'^{name}{{model="{model}",version="1"}} (\d+)', text, re.M)
    return None if m is None else int(m.group(1))


def infer_simple(module, url, offset=0, outputs=None):
    inputs, a, b = simple_inputs(module)
    a = a + offset
    inputs[0].set_data_from_numpy(a)
    with module.InferenceServerClient(url) as c:
        r = c.infer("simple", inputs, outputs=outputs)
    return r, a, b


def test_grpc_store_http_hit_and_statistics(cached):
    before = stats(cached.http_url, "simple")
    r, a, b = infer_simple(grpcclient, cached.grpc_url, offset=1000)
    np.testing.assert_array_equal(r.as_numpy("OUTPUT0"), a + b)
    after_miss = stats(cached.http_url, "simple")
    assert after_miss["miss"] == before["miss"] + 1
    assert after_miss["exec"] == before["exec"] + 1
    assert after_miss["miss_ns"] > before["miss_ns"]

    for module, url in ((httpclient, cached.http_url), (grpcclient, cached.grpc_url)):
        r, a, b = infer_simple(module, url, offset=1000)
        np.testing.assert_array_equal(r.as_numpy("OUTPUT0"), a + b)
        np.testing.assert_array_equal(r.as_numpy("OUTPUT1"), a - b)
    after = stats(cached.http_url, "simple")
    assert after["hit"] == before["hit"] + 2
    assert after["hit_ns"] > before["hit_ns"]
    assert after["success"] == before["success"] + 3
    assert after["queue"] == before["queue"] + 3
    # Hits never reach the model.
    assert after["exec"] == before["exec"] + 1
    assert after["inf"] == before["inf"] + 1
    assert after["miss"] == before["miss"] + 1

    assert metric(cached, "nv_cache_num_hits_per_model", "simple") == after["hit"]
    assert metric(cached, "nv_cache_num_misses_per_model", "simple") == after["miss"]
    assert metric(cached, "nv_cache_hit_duration_per_model", "simple") is not None
    assert metric(cached, "nv_cache_miss_duration_per_model", "simple") is not None
    # Only models using the cache have the cache metrics.
    assert metric(cached, "nv_cache_num_hits_per_model", "simple_int8") is None
    assert metric(cached, "nv_inference_exec_count", "simple") == after["exec"]


def test_different_requests_never_share_an_entry(cached):
    before = stats(cached.http_url, "simple")
    # Stored: outputs not named.
    infer_simple(httpclient, cached.http_url, offset=2000)
    # Different data: its own answer.
    r, a, b = infer_simple(httpclient, cached.http_url, offset=2001)
    np.testing.assert_array_equal(r.as_numpy("OUTPUT0"), a + b)
    # Same data, one output asked for: not the stored two-output response.
    r, a, b = infer_simple(grpcclient, cached.grpc_url, offset=2000,
                           outputs=[grpcclient.InferRequestedOutput("OUTPUT1")])
    np.testing.assert_array_equal(r.as_numpy("OUTPUT1"), a - b)
    assert r.as_numpy("OUTPUT0") is None
    after = stats(cached.http_url, "simple")
    assert after["hit"] == before["hit"]
    assert after["miss"] == before["miss"] + 3
    assert after["exec"] == before["exec"] + 3
    # And each is now a hit of its own.
    r, a, b = infer_simple(grpcclient, cached.grpc_url, offset=2000,
                           outputs=[grpcclient.InferRequestedOutput("OUTPUT1")])
    np.testing.assert_array_equal(r.as_numpy("OUTPUT1"), a - b)
    assert r.as_numpy("OUTPUT0") is None
    assert stats(cached.http_url, "simple")["hit"] == before["hit"] + 1


def test_request_id_is_the_requests_own_on_a_hit(cached):
    inputs, a, b = simple_inputs(grpcclient)
    inputs[0].set_data_from_numpy(a + 3000)
    with grpcclient.InferenceServerClient(cached.grpc_url) as c:
        c.infer("simple", inputs, request_id="first")
        r = c.infer("simple", inputs, request_id="second")
    assert r.get_response().id == "second"


def test_ensemble_is_cached_at_the_top_level(cached):
    before = stats(cached.http_url, "simple_ensemble")
    steps_before = stats(cached.http_url, "simple_nc")
    for module, url in ((grpcclient, cached.grpc_url), (httpclient, cached.http_url)):
        inputs, a, b = simple_inputs(module)
        inputs[0].set_data_from_numpy(a + 4000)
        with module.InferenceServerClient(url) as c:
            r = c.infer("simple_ensemble", inputs)
        np.testing.assert_array_equal(r.as_numpy("OUTPUT0"), 2 * (a + 4000))
    after = stats(cached.http_url, "simple_ensemble")
    assert after["miss"] == before["miss"] + 1
    assert after["hit"] == before["hit"] + 1
    assert after["success"] == before["success"] + 2
    # The whole ensemble was skipped on the hit: its steps ran once.
    assert stats(cached.http_url, "simple_nc")["exec"] == steps_before["exec"] + 2


def test_shared_memory_outputs_are_written_on_a_hit(cached):
    name = "cache_out"
    handle = shm.create_shared_memory_region(name, "/" + name, 128)
    try:
        with httpclient.InferenceServerClient(cached.http_url) as c:
            c.register_system_shared_memory(name, "/" + name, 128)
            try:
                inputs, a, b = simple_inputs(httpclient)
                inputs[0].set_data_from_numpy(a + 5000)
                plain = [httpclient.InferRequestedOutput("OUTPUT0"),
                         httpclient.InferRequestedOutput("OUTPUT1")]
                c.infer("simple", inputs, outputs=plain)
                before = stats(cached.http_url, "simple")
                out0 = httpclient.InferRequestedOutput("OUTPUT0", binary_data=False)
                out0.set_shared_memory(name, 64)
                out1 = httpclient.InferRequestedOutput("OUTPUT1", binary_data=False)
                out1.set_shared_memory(name, 64, offset=64)
                c.infer("simple", inputs, outputs=[out0, out1])
                assert stats(cached.http_url, "simple")["hit"] == before["hit"] + 1
                got0 = shm.get_contents_as_numpy(handle, np.int32, [1, 16], offset=0)
                got1 = shm.get_contents_as_numpy(handle, np.int32, [1, 16], offset=64)
                np.testing.assert_array_equal(got0, a + 5000 + b)
                np.testing.assert_array_equal(got1, a + 5000 - b)
            finally:
                c.unregister_system_shared_memory(name)
    finally:
        shm.destroy_shared_memory_region(handle)


def identity(url, payload):
    inp = grpcclient.InferInput("INPUT0", [1, 1], "BYTES")
    inp.set_data_from_numpy(np.array([[payload]], dtype=np.object_))
    with grpcclient.InferenceServerClient(url) as c:
        r = c.infer("simple_identity", [inp])
    assert r.as_numpy("OUTPUT0")[0][0] == payload


def test_eviction_at_the_size_bound(tmp_path):
    repo = tmp_path / "repo"
    repo.mkdir()
    copy_model("simple_identity", repo)
    # One entry of a 300-byte payload is about 1000 bytes: two fit.
    server = ServerProcess([repo], ["--response-cache-byte-size", "2500"],
                           log="response-cache-evict-server.log")
    try:
        url = server.http_url
        a, b, c = (bytes([65 + i]) * 300 for i in range(3))
        identity(server.grpc_url, a)
        identity(server.grpc_url, b)
        identity(server.grpc_url, a)  # hit: `a` is now the most recent
        identity(server.grpc_url, c)  # evicts `b`, the least recently used
        s = stats(url, "simple_identity")
        assert (s["hit"], s["miss"]) == (1, 3)
        identity(server.grpc_url, a)  # still there
        assert stats(url, "simple_identity")["hit"] == 2
        identity(server.grpc_url, b)  # evicted: runs again
        s = stats(url, "simple_identity")
        assert (s["hit"], s["miss"], s["exec"]) == (2, 4, 4)
        # A response larger than the whole cache is never stored.
        big = b"Z" * 4000
        identity(server.grpc_url, big)
        identity(server.grpc_url, big)
        s = stats(url, "simple_identity")
        assert s["hit"] == 2 and s["exec"] == 6
    finally:
        server.stop_expecting_success()


def test_a_model_enabling_the_cache_without_one_runs_uncached(tmp_path):
    repo = tmp_path / "repo"
    repo.mkdir()
    copy_model("simple", repo)
    server = ServerProcess([repo], log="response-cache-none-server.log")
    try:
        for _ in range(2):
            infer_simple(httpclient, server.http_url)
        s = stats(server.http_url, "simple")
        assert (s["hit"], s["miss"], s["exec"]) == (0, 0, 2)
        assert metric(server, "nv_cache_num_hits_per_model", "simple") is None
    finally:
        server.stop_expecting_success()


def start_failure(repo, *args):
    """Runs the server expecting it to refuse to start; its output."""
    p = subprocess.run([str(BINARY), "--model-repository", str(repo), "--host", "127.0.0.1",
                        "--http-port", "0", "--grpc-port", "0", "--metrics-port", "0", *args],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode != 0, p.stdout + p.stderr
    return p.stdout + p.stderr


@pytest.mark.parametrize("args,text", [
    (["--cache-config", "local,size=abc"], "size 'abc'"),
    (["--cache-config", "local,size=-1"], "size '-1'"),
    (["--cache-config", "redis,host=localhost"],
     "unable to find 'libtritoncache_redis.so' for cache"),
    (["--cache-config", "local,size=8192", "--cache-config", "redis,key=value"],
     "multiple cache configurations"),
    (["--response-cache-byte-size", "12345", "--cache-config", "local,size=67890"],
     "Incompatible flags"),
])
def test_bad_cache_settings_fail_start_up(tmp_path, args, text):
    assert text in start_failure(tmp_path, *args)


def test_decoupled_model_with_the_cache_is_refused(tmp_path):
    repo = tmp_path / "repo"
    repo.mkdir()
    copy_model("repeat_int32", repo)
    out = start_failure(repo, "--cache-config", "local,size=8192")
    assert ("Response Cache does not currently support model repeat_int32 with "
            "'decoupled' transaction policy") in out


def test_concurrent_identical_requests_are_answered_correctly(cached):
    from concurrent.futures import ThreadPoolExecutor

    before = stats(cached.http_url, "simple")

    def one(i):
        module, url = ((grpcclient, cached.grpc_url), (httpclient, cached.http_url))[i % 2]
        r, a, b = infer_simple(module, url, offset=6000)
        np.testing.assert_array_equal(r.as_numpy("OUTPUT0"), a + b)
        np.testing.assert_array_equal(r.as_numpy("OUTPUT1"), a - b)

    with ThreadPoolExecutor(16) as pool:
        list(pool.map(one, range(32)))
    after = stats(cached.http_url, "simple")
    assert after["success"] == before["success"] + 32
    ran = after["exec"] - before["exec"]
    hits = after["hit"] - before["hit"]
    misses = after["miss"] - before["miss"]
    # Every request either hit or ran; of those that ran at once, one stored
    # the answer (a miss) and the others found it stored (counted in neither).
    assert hits + ran == 32
    assert misses == 1
    assert ran >= 1
