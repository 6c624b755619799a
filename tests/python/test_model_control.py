"""The model repository extension through tritonclient, and Triton's
model-control examples run unchanged against an explicit-mode server whose
repository holds exactly the number of models they expect (7 for HTTP,
8 for gRPC)."""

import pathlib
import shutil
import subprocess
import sys

import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from serverproc import ROOT, ServerProcess

EXAMPLES = pathlib.Path(__file__).resolve().parent / "examples"
# Built-in models only: no ONNX Runtime needed.
SEVEN = ["simple", "simple_int8", "simple_string", "simple_identity",
         "simple_dyna_batch", "simple_sequence", "sequence_accumulator"]
EIGHTH = "simple_dyna_sequence"


@pytest.fixture(scope="module")
def explicit_server(tmp_path_factory):
    repo = tmp_path_factory.mktemp("explicit-repo")
    for name in SEVEN:
        shutil.copytree(ROOT / "models" / name, repo / name)
    server = ServerProcess([repo], ["--model-control-mode", "explicit"],
                           log="python-model-control-server.log", ready_path="/v2/health/live")
    yield repo, server.http_url, server.grpc_url
    server.stop_expecting_success()


def _run(example, url):
    p = subprocess.run([sys.executable, str(EXAMPLES / example), "-u", url],
                       capture_output=True, text=True, timeout=60, cwd=EXAMPLES)
    assert p.returncode == 0, f"{example} failed:\n{p.stdout}\n{p.stderr}"
    assert "PASS" in p.stdout, p.stdout


def test_triton_model_control_examples(explicit_server):
    repo, http_url, grpc_url = explicit_server
    _run("simple_http_model_control.py", http_url)
    shutil.copytree(ROOT / "models" / EIGHTH, repo / EIGHTH)
    try:
        _run("simple_grpc_model_control.py", grpc_url)
    finally:
        shutil.rmtree(repo / EIGHTH)


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_load_unload_index_and_errors(explicit_server, protocol):
    _, http_url, grpc_url = explicit_server
    if protocol == "http":
        c = httpclient.InferenceServerClient(http_url)
        index = lambda ready=False: c.get_model_repository_index() if not ready else [
            m for m in c.get_model_repository_index() if m.get("state") == "READY"]
        names = lambda rows: {m["name"]: m for m in rows}
    else:
        c = grpcclient.InferenceServerClient(grpc_url)
        index = lambda ready=False: c.get_model_repository_index(as_json=True).get("models", [])
        names = lambda rows: {m["name"]: m for m in rows}
    c.load_model("simple_int8")
    assert c.is_model_ready("simple_int8")
    assert names(index())["simple_int8"]["state"] == "READY"
    c.unload_model("simple_int8")
    assert not c.is_model_ready("simple_int8")
    row = names(index())["simple_int8"]
    assert (row["state"], row["reason"]) == ("UNAVAILABLE", "unloaded")
    with pytest.raises(InferenceServerException, match="failed to load 'no_such_model'"):
        c.load_model("no_such_model")
    # A bad override fails and leaves the loaded version serving.
    c.load_model("simple_string")
    with pytest.raises(InferenceServerException, match="failed to load"):
        c.load_model("simple_string", config='{"max_batch_size": "many"}')
    assert c.is_model_ready("simple_string")
    # Model files must stay inside the model folder.
    with pytest.raises(InferenceServerException, match="inside the model folder"):
        c.load_model("escape", config='{"backend": "simple"}', files={"file:../x": b"a"})
    c.unload_model("simple_string")
    c.unload_model("never_loaded")


PY_BACKEND = ROOT / ".backends" / "python" / "libtriton_python.so"
PY_SIMPLE_CONFIG = {
    "backend": "python",
    "max_batch_size": 8,
    "input": [{"name": n, "data_type": "TYPE_INT32", "dims": [16]} for n in ("INPUT0", "INPUT1")],
    "output": [{"name": n, "data_type": "TYPE_INT32", "dims": [16]} for n in ("OUTPUT0", "OUTPUT1")],
    "instance_group": [{"count": 1, "kind": "KIND_CPU"}],
}


@pytest.mark.parametrize("allow", [False, True], ids=["default", "opt-in"])
def test_uploaded_python_model_runs_only_with_the_opt_in(tmp_path, allow):
    """A `model.py` sent with a load request: refused by default (the answer
    names the file and the flag), loaded and run with
    --model-load-allow-uploaded-python."""
    import json

    import numpy as np

    if not PY_BACKEND.exists():
        pytest.skip(f"Triton's Python backend is not installed ({PY_BACKEND}); scripts/setup.sh installs it")
    repo = tmp_path / "repo"
    repo.mkdir()
    args = ["--model-control-mode", "explicit"]
    if allow:
        args.append("--model-load-allow-uploaded-python")
    # Ready (not just live): the repository API answers once start-up is done.
    server = ServerProcess([repo], args, log="python-upload-server.log")
    try:
        source = (ROOT / "models_python" / "py_simple" / "1" / "model.py").read_bytes()
        config = json.dumps(PY_SIMPLE_CONFIG)
        for client in (httpclient.InferenceServerClient(server.http_url),
                       grpcclient.InferenceServerClient(server.grpc_url)):
            if not allow:
                with pytest.raises(InferenceServerException) as e:
                    client.load_model("uploaded_py", config=config, files={"file:1/model.py": source})
                assert "'1/model.py'" in str(e.value) and "--model-load-allow-uploaded-python" in str(e.value)
                assert not client.is_model_ready("uploaded_py")
                continue
            client.load_model("uploaded_py", config=config, files={"file:1/model.py": source})
            assert client.is_model_ready("uploaded_py")
        if allow:
            c = httpclient.InferenceServerClient(server.http_url)
            a = np.arange(16, dtype=np.int32).reshape(1, 16)
            b = np.ones((1, 16), dtype=np.int32)
            inputs = [httpclient.InferInput("INPUT0", [1, 16], "INT32"),
                      httpclient.InferInput("INPUT1", [1, 16], "INT32")]
            inputs[0].set_data_from_numpy(a)
            inputs[1].set_data_from_numpy(b)
            result = c.infer("uploaded_py", inputs)
            np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)
            np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - b)
    finally:
        server.stop_expecting_success(timeout_s=30)
