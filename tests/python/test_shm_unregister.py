"""Unregistering shared memory while requests use it, as Triton's
L0_shared_memory `TestSharedMemoryUnregister` pins it down: the unregister
succeeds at once, the regions stay registered (and usable by new requests)
while a request holds them, and they are gone as soon as the last such
request has been answered, without another unregister call."""

import os
import threading
import time

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
import tritonclient.utils.shared_memory as shm
from tritonclient.utils import InferenceServerException

from serverproc import ServerProcess

# The model runs this long; a request is taken to be executing START_S
# after its thread starts.
BUSY_MS = 3000
START_S = 1.0
BYTES = 16

SLOW_IDENTITY = f"""
name: "slow"
backend: "identity"
max_batch_size: 1
input [ {{ name: "INPUT0" data_type: TYPE_INT32 dims: [ 4 ] }} ]
output [ {{ name: "OUTPUT0" data_type: TYPE_INT32 dims: [ 4 ] }} ]
instance_group [ {{ count: 2 kind: KIND_CPU }} ]
parameters {{ key: "execute_delay_ms" value: {{ string_value: "{BUSY_MS}" }} }}
"""


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    repo = tmp_path_factory.mktemp("shm_unregister")
    (repo / "slow" / "1").mkdir(parents=True)
    (repo / "slow" / "config.pbtxt").write_text(SLOW_IDENTITY)
    proc = ServerProcess([repo], log="shm-unregister-server.log")
    yield proc
    proc.stop_expecting_success(timeout_s=30)


@pytest.fixture
def shm_pair():
    """An input and an output region, created and removed by the test."""
    made = []
    for role in ("in", "out"):
        name = f"unreg_{os.getpid()}_{role}_{time.monotonic_ns()}"
        made.append((name, f"/{name}", shm.create_shared_memory_region(name, f"/{name}", BYTES)))
    yield made
    for _, _, handle in made:
        shm.destroy_shared_memory_region(handle)


def registered(server):
    status = httpclient.InferenceServerClient(server.http_url).get_system_shared_memory_status()
    return sorted(r["name"] for r in status)


def start_request(proto, server, pair):
    """Sends one request, from its own thread, reading INPUT0 from the
    first region and writing OUTPUT0 to the second; returns once it is
    well inside the model's execution, with a function that waits for its
    answer."""
    (in_name, _, _), (out_name, _, _) = pair
    module = httpclient if proto == "http" else grpcclient
    url = server.http_url if proto == "http" else server.grpc_url
    answers = []

    def send():
        i = module.InferInput("INPUT0", [1, 4], "INT32")
        i.set_shared_memory(in_name, BYTES)
        o = module.InferRequestedOutput("OUTPUT0")
        o.set_shared_memory(out_name, BYTES)
        try:
            answers.append(module.InferenceServerClient(url).infer("slow", [i], outputs=[o]))
        except InferenceServerException as e:
            answers.append(e)

    thread = threading.Thread(target=send)
    thread.start()
    time.sleep(START_S)

    def wait():
        thread.join(timeout=30)
        assert answers, "no answer in 30 s"
        if isinstance(answers[0], Exception):
            raise answers[0]
        return answers[0]

    return wait


def register(server, pair, value):
    admin = httpclient.InferenceServerClient(server.http_url)
    (_, _, in_handle), _ = pair
    shm.set_shared_memory_region(in_handle, [np.full((1, 4), value, dtype=np.int32)])
    for name, key, _ in pair:
        admin.register_system_shared_memory(name, key, BYTES)
    return sorted(name for name, _, _ in pair)


def output(pair):
    _, (_, _, out_handle) = pair
    return shm.get_contents_as_numpy(out_handle, np.int32, [1, 4])


@pytest.mark.parametrize("proto", ["http", "grpc"])
def test_unregister_during_inference_completes_after_it(server, shm_pair, proto):
    names = register(server, shm_pair, 7)
    wait = start_request(proto, server, shm_pair)

    httpclient.InferenceServerClient(server.http_url).unregister_system_shared_memory()
    assert registered(server) == names, "kept while the request holds them"

    wait()
    assert np.array_equal(output(shm_pair), np.full((1, 4), 7, dtype=np.int32))
    assert registered(server) == [], "gone once the answer is out, without another call"
    for name in names:
        with pytest.raises(InferenceServerException) as e:
            httpclient.InferenceServerClient(server.http_url).get_system_shared_memory_status(name)
        assert f"Unable to find system shared memory region: '{name}'" in str(e.value)


@pytest.mark.parametrize("proto", ["http", "grpc"])
def test_regions_awaiting_unregister_serve_new_requests(server, shm_pair, proto):
    names = register(server, shm_pair, 5)
    first = start_request(proto, server, shm_pair)
    httpclient.InferenceServerClient(server.http_url).unregister_system_shared_memory(names[0])
    httpclient.InferenceServerClient(server.http_url).unregister_system_shared_memory(names[1])
    # Still registered, so a second request may name them (as in Triton).
    second = start_request(proto, server, shm_pair)
    first()
    assert registered(server) == names, "the second request still holds them"
    second()
    assert np.array_equal(output(shm_pair), np.full((1, 4), 5, dtype=np.int32))
    assert registered(server) == []


def test_unregister_after_inference_is_immediate(server, shm_pair):
    names = register(server, shm_pair, 3)
    start_request("http", server, shm_pair)()
    assert registered(server) == names, "an answered request does not unregister"
    httpclient.InferenceServerClient(server.http_url).unregister_system_shared_memory()
    assert registered(server) == []
