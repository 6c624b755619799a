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
