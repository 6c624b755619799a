"""Several --model-repository folders, as tritonserver 2.51 serves them:
models from every repository are served and indexed; a model folder name
found in two repositories loads from neither (UNAVAILABLE in the index with
Triton's reason "model appears in two or more repositories", unknown to
requests), fails the start-up under --exit-on-error, and fails an explicit
load with "failed to poll from model repository"."""

import json
import shutil
import subprocess
import urllib.request

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from serverproc import BINARY, ROOT, ServerProcess, free_port

DUPLICATE = "model appears in two or more repositories"


def _repos(tmp_path, a, b):
    """Two repositories holding copies of the example models named in `a`
    and `b`."""
    roots = []
    for tag, names in (("a", a), ("b", b)):
        root = tmp_path / f"repo_{tag}"
        root.mkdir()
        for name in names:
            shutil.copytree(ROOT / "models" / name, root / name)
        roots.append(root)
    return roots


def _client(server, protocol):
    if protocol == "http":
        return httpclient, httpclient.InferenceServerClient(server.http_url)
    return grpcclient, grpcclient.InferenceServerClient(server.grpc_url)


def _index(client, protocol):
    if protocol == "http":
        rows = client.get_model_repository_index()
    else:
        rows = client.get_model_repository_index(as_json=True).get("models", [])
    return {m["name"]: m for m in rows}


def _infer_simple(module, client, model):
    dtype, name = (np.int8, "INT8") if model == "simple_int8" else (np.int32, "INT32")
    a = np.arange(16, dtype=dtype).reshape(1, 16)
    b = np.ones((1, 16), dtype=dtype)
    inputs = [module.InferInput("INPUT0", [1, 16], name), module.InferInput("INPUT1", [1, 16], name)]
    inputs[0].set_data_from_numpy(a)
    inputs[1].set_data_from_numpy(b)
    result = client.infer(model, inputs)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)


@pytest.fixture(scope="module")
def duplicate_server(tmp_path_factory):
    """simple in A, simple_int8 in B, simple_string in both; served with
    --exit-on-error=false (Triton then serves the rest)."""
    roots = _repos(tmp_path_factory.mktemp("dup"), ["simple", "simple_string"],
                   ["simple_int8", "simple_string"])
    server = ServerProcess(roots, ["--exit-on-error=false"], log="python-multiple-repos-server.log")
    yield server
    server.stop_expecting_success()


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_models_of_every_repository_are_served(duplicate_server, protocol):
    module, client = _client(duplicate_server, protocol)
    assert client.is_server_ready()
    for model in ("simple", "simple_int8"):
        assert client.is_model_ready(model)
        _infer_simple(module, client, model)
    index = _index(client, protocol)
    assert index["simple"]["state"] == "READY"
    assert index["simple_int8"]["state"] == "READY"


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_a_duplicated_name_is_unavailable_with_the_reason(duplicate_server, protocol):
    module, client = _client(duplicate_server, protocol)
    row = _index(client, protocol)["simple_string"]
    assert row["state"] == "UNAVAILABLE"
    assert row["reason"] == DUPLICATE
    assert "version" not in row
    assert not client.is_model_ready("simple_string")
    with pytest.raises(InferenceServerException, match="Request for unknown model: 'simple_string' is not found"):
        client.get_model_metadata("simple_string")
    inputs = [module.InferInput("INPUT0", [1, 16], "BYTES")]
    inputs[0].set_data_from_numpy(np.array([[b"x"] * 16], dtype=np.object_))
    with pytest.raises(InferenceServerException, match="simple_string"):
        client.infer("simple_string", inputs)


def test_a_duplicated_name_is_listed_in_the_ready_index(duplicate_server):
    """Triton lists a duplicate even when only ready models are asked for
    (tritonclient has no `ready` argument: the request is sent by hand)."""
    request = urllib.request.Request(f"http://{duplicate_server.http_url}/v2/repository/index",
                                     data=json.dumps({"ready": True}).encode(), method="POST")
    with urllib.request.urlopen(request, timeout=30) as r:
        names = {m["name"]: m for m in json.load(r)}
    assert names["simple_string"] == {"name": "simple_string", "state": "UNAVAILABLE", "reason": DUPLICATE}
    assert names["simple"]["state"] == "READY"


def test_a_duplicated_name_fails_the_start_up(tmp_path):
    """Control mode none, --exit-on-error (the default): the server stops
    and exits non-zero, as tritonserver ("failed to load all models")."""
    roots = _repos(tmp_path, ["simple", "simple_string"], ["simple_string"])
    command = [str(BINARY)]
    for root in roots:
        command += ["--model-repository", str(root)]
    command += ["--host", "127.0.0.1", "--http-port", str(free_port()), "--grpc-port", str(free_port()),
                "--metrics-port", str(free_port()), "--cores", "2", "--exit-timeout-secs", "5"]
    p = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert p.returncode != 0
    out = p.stdout + p.stderr
    assert "failed to load all models" in out and "simple_string" in out, out[-4000:]


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_explicit_load_of_a_duplicated_name_fails(tmp_path, protocol):
    roots = _repos(tmp_path, ["simple", "simple_string"], ["simple_int8", "simple_string"])
    server = ServerProcess(roots, ["--model-control-mode", "explicit"],
                           log=f"python-multiple-repos-explicit-{protocol}.log")
    try:
        module, client = _client(server, protocol)
        index = _index(client, protocol)
        assert set(index) == {"simple", "simple_int8", "simple_string"}
        assert (index["simple_string"]["state"], index["simple_string"]["reason"]) == ("UNAVAILABLE", DUPLICATE)
        with pytest.raises(InferenceServerException,
                           match="failed to load 'simple_string', failed to poll from model repository"):
            client.load_model("simple_string")
        assert not client.is_model_ready("simple_string")
        # Models of either repository load.
        client.load_model("simple")
        client.load_model("simple_int8")
        _infer_simple(module, client, "simple")
        _infer_simple(module, client, "simple_int8")
        # Once the copy in B is gone, the name loads from A.
        shutil.rmtree(roots[1] / "simple_string")
        client.load_model("simple_string")
        assert client.is_model_ready("simple_string")
    finally:
        server.stop_expecting_success()


def _metrics(server):
    with urllib.request.urlopen(f"http://{server.metrics_url}/metrics", timeout=30) as r:
        return r.read().decode()


def test_without_namespacing_metrics_have_no_namespace_label(duplicate_server):
    text = _metrics(duplicate_server)
    assert 'nv_inference_count{model="simple",version="1"}' in text
    assert "namespace=" not in text


AMBIGUOUS = ("There are 2 identifiers of model 'pair' in global map, "
             "model namespace must be provided to resolve ambiguity.")


def _pair_repos(tmp_path):
    """A: simple, `pair` (INT32 add/sub) and the ensemble `ens_a` of two
    `pair` steps; B: simple_int8, `pair` (INT8 add/sub) and `ens_b`, the
    same ensemble in INT8. Each ensemble only wires to its own
    repository's `pair` (the datatypes differ)."""
    roots = _repos(tmp_path, ["simple"], ["simple_int8"])
    for root, source, ens, dtype in ((roots[0], "simple", "ens_a", "TYPE_INT32"),
                                     (roots[1], "simple_int8", "ens_b", "TYPE_INT8")):
        shutil.copytree(ROOT / "models" / source, root / "pair")
        config = (root / "pair" / "config.pbtxt").read_text()
        (root / "pair" / "config.pbtxt").write_text(config.replace(f'name: "{source}"', 'name: "pair"'))
        (root / ens / "1").mkdir(parents=True)
        config = (ROOT / "models" / "simple_ensemble" / "config.pbtxt").read_text()
        config = (config.replace('name: "simple_ensemble"', f'name: "{ens}"')
                  .replace('model_name: "simple"', 'model_name: "pair"')
                  .replace("TYPE_INT32", dtype))
        (root / ens / "config.pbtxt").write_text(config)
    return roots


@pytest.fixture(scope="module")
def namespaced_server(tmp_path_factory):
    roots = _pair_repos(tmp_path_factory.mktemp("ns"))
    server = ServerProcess(roots, ["--model-namespacing=true"], log="python-namespacing-server.log")
    yield roots, server
    server.stop_expecting_success()


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_namespacing_serves_a_name_from_two_repositories(namespaced_server, protocol):
    _, server = namespaced_server
    module, client = _client(server, protocol)
    assert client.is_server_ready()
    if protocol == "http":
        rows = client.get_model_repository_index()
    else:
        rows = client.get_model_repository_index(as_json=True).get("models", [])
    pairs = [r for r in rows if r["name"] == "pair"]
    assert [r["state"] for r in pairs] == ["READY", "READY"], rows
    for model in ("simple", "simple_int8"):
        _infer_simple(module, client, model)
    # Each ensemble runs its own repository's `pair`: (a+b)+(a-b) = 2a.
    for ens, dtype, name in (("ens_a", np.int32, "INT32"), ("ens_b", np.int8, "INT8")):
        assert client.is_model_ready(ens)
        a = np.arange(16, dtype=dtype).reshape(1, 16)
        b = np.ones((1, 16), dtype=dtype)
        inputs = [module.InferInput("INPUT0", [1, 16], name), module.InferInput("INPUT1", [1, 16], name)]
        inputs[0].set_data_from_numpy(a)
        inputs[1].set_data_from_numpy(b)
        result = client.infer(ens, inputs)
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + a)
        np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), b + b)


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_namespacing_refuses_a_direct_request_for_an_ambiguous_name(namespaced_server, protocol):
    _, server = namespaced_server
    module, client = _client(server, protocol)
    for call in (lambda: client.get_model_metadata("pair"),
                 lambda: client.get_model_config("pair"),
                 lambda: client.get_inference_statistics("pair")):
        with pytest.raises(InferenceServerException) as e:
            call()
        assert AMBIGUOUS in str(e.value)
    a = np.zeros((1, 16), dtype=np.int32)
    inputs = [module.InferInput("INPUT0", [1, 16], "INT32"), module.InferInput("INPUT1", [1, 16], "INT32")]
    inputs[0].set_data_from_numpy(a)
    inputs[1].set_data_from_numpy(a)
    with pytest.raises(InferenceServerException) as e:
        client.infer("pair", inputs)
    assert AMBIGUOUS in str(e.value)
    assert not client.is_model_ready("pair")


def test_namespacing_labels_metrics_with_the_repository(namespaced_server):
    roots, server = namespaced_server
    text = _metrics(server)
    for root, model in ((roots[0], "simple"), (roots[0], "pair"), (roots[1], "pair"),
                        (roots[1], "simple_int8"), (roots[0], "ens_a")):
        assert f'nv_inference_count{{model="{model}",namespace="{root}",version="1"}}' in text, text[:3000]


def test_namespacing_refuses_to_load_an_ambiguous_name(tmp_path):
    roots = _pair_repos(tmp_path)
    server = ServerProcess(roots, ["--model-namespacing=true", "--model-control-mode=explicit"],
                           log="python-namespacing-explicit.log")
    try:
        for module, client in (_client(server, "http"), _client(server, "grpc")):
            with pytest.raises(InferenceServerException) as e:
                client.load_model("pair")
            assert AMBIGUOUS in str(e.value)
            with pytest.raises(InferenceServerException) as e:
                client.unload_model("pair")
            assert AMBIGUOUS in str(e.value)
            # An ensemble brings its own repository's copy.
            client.load_model("ens_a")
            assert client.is_model_ready("ens_a")
    finally:
        server.stop_expecting_success()
