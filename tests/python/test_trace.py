"""The trace extension through tritonclient (HTTP and gRPC): global and
per-model settings, clearing a model's setting back to the global one, and
the trace file the traced requests produce (Triton's JSON)."""

import json

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from serverproc import ROOT, ServerProcess


@pytest.fixture(scope="module")
def traced(tmp_path_factory):
    trace_file = tmp_path_factory.mktemp("trace") / "trace.json"
    server = ServerProcess(
        [ROOT / "models"],
        ["--trace-config", f"triton,file={trace_file}", "--trace-config", "rate=1"],
        log="python-trace-server.log",
    )
    server.file = trace_file
    yield server
    server.stop_expecting_success()


def _simple_infer(module, url, request_id):
    client = module.InferenceServerClient(url)
    a = np.arange(16, dtype=np.int32).reshape(1, 16)
    inputs = [module.InferInput("INPUT0", [1, 16], "INT32"), module.InferInput("INPUT1", [1, 16], "INT32")]
    inputs[0].set_data_from_numpy(a)
    inputs[1].set_data_from_numpy(a)
    result = client.infer("simple", inputs, request_id=request_id)
    assert (result.as_numpy("OUTPUT0") == 2 * a).all()


def test_http_global_and_model_settings(traced):
    c = httpclient.InferenceServerClient(traced.http_url)
    g = c.get_trace_settings()
    assert g["trace_level"] == ["OFF"]
    assert g["trace_rate"] == "1"
    assert g["trace_file"] == str(traced.file)
    assert g["trace_mode"] == "triton"
    m = c.update_trace_settings(model_name="simple", settings={"trace_level": ["TIMESTAMPS"]})
    assert m["trace_level"] == ["TIMESTAMPS"]
    assert c.get_trace_settings(model_name="simple")["trace_level"] == ["TIMESTAMPS"]
    # The global setting is unchanged; a global change reaches the model's
    # values it does not set itself.
    assert c.get_trace_settings()["trace_level"] == ["OFF"]
    c.update_trace_settings(settings={"trace_count": "50"})
    assert c.get_trace_settings(model_name="simple")["trace_count"] == "50"
    with pytest.raises(InferenceServerException, match="can not be updated through network protocol"):
        c.update_trace_settings(settings={"trace_file": "/tmp/elsewhere.json"})
    with pytest.raises(InferenceServerException, match="Request for unknown model"):
        c.get_trace_settings(model_name="no_such_model")


def test_grpc_global_and_model_settings(traced):
    c = grpcclient.InferenceServerClient(traced.grpc_url)
    g = c.get_trace_settings(as_json=True)["settings"]
    assert g["trace_level"]["value"] == ["OFF"]
    m = c.get_trace_settings(model_name="simple", as_json=True)["settings"]
    assert m["trace_level"]["value"] == ["TIMESTAMPS"]
    r = c.update_trace_settings(model_name="simple", settings={"trace_rate": "1", "trace_count": "-1"},
                                as_json=True)["settings"]
    assert r["trace_rate"]["value"] == ["1"]
    assert r["trace_count"]["value"] == ["-1"]
    with pytest.raises(InferenceServerException, match="TENSORS"):
        c.update_trace_settings(settings={"trace_level": ["TENSORS"]})


def test_traced_requests_and_clearing(traced):
    _simple_infer(httpclient, traced.http_url, "http-req")
    _simple_infer(grpcclient, traced.grpc_url, "grpc-req")
    c = httpclient.InferenceServerClient(traced.http_url)
    # null clears every value the model set back to the global ones.
    m = c.update_trace_settings(model_name="simple",
                                settings={"trace_level": None, "trace_rate": None, "trace_count": None})
    assert m["trace_level"] == ["OFF"]
    assert m["trace_count"] == "50"
    _simple_infer(httpclient, traced.http_url, "untraced")
    traced.stop_expecting_success()
    traces = json.loads(traced.file.read_text())
    heads = {t["id"]: t for t in traces if "model_name" in t}
    names = {}
    for t in traces:
        for ts in t.get("timestamps", []):
            names.setdefault(t["id"], []).append(ts["name"])
    by_request = {h["request_id"]: names[i] for i, h in heads.items()}
    assert set(by_request) == {"http-req", "grpc-req"}
    assert by_request["http-req"][0] == "HTTP_RECV_START"
    assert by_request["http-req"][-1] == "HTTP_SEND_END"
    assert by_request["grpc-req"][-1] == "GRPC_SEND_END"
    for events in by_request.values():
        assert "COMPUTE_START" in events and "REQUEST_END" in events
