"""Plain HTTP for the SageMaker and Vertex AI suites (their clients send
plain requests, not tritonclient's), and a repository of chosen example
models for a server started with their environment variables."""

import http.client
import json
import os
import shutil

import numpy as np
import tritonclient.http as httpclient

from serverproc import ROOT

SAGEMAKER_MIME = "application/vnd.sagemaker-triton.binary+json;json-header-size="
VERTEX_MIME = "application/vnd.vertex-ai-triton.binary+json;json-header-size="


def call(hostport, method, path, body=None, headers=None, timeout=30):
    """(status, headers as a lower-cased dict, body bytes)."""
    host, port = hostport.rsplit(":", 1)
    conn = http.client.HTTPConnection(host, int(port), timeout=timeout)
    try:
        conn.request(method, path, body=body, headers=headers or {})
        r = conn.getresponse()
        return r.status, {k.lower(): v for k, v in r.getheaders()}, r.read()
    finally:
        conn.close()


def repo_of(tmp_path, *models):
    """A repository holding copies of the named example models."""
    repo = tmp_path / "repo"
    repo.mkdir()
    for m in models:
        shutil.copytree(ROOT / "models" / m, repo / m)
    return repo


class environ:
    """Sets environment variables (None: unset) for the servers started
    inside, which inherit them; restores them after."""

    def __init__(self, **values):
        self.values = values
        self.saved = {}

    def __enter__(self):
        for k, v in self.values.items():
            self.saved[k] = os.environ.get(k)
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        return self

    def __exit__(self, *exc):
        for k, v in self.saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def simple_request(binary):
    """A KServe request for `simple` as tritonclient builds it: (body,
    JSON header length, INPUT0, INPUT1)."""
    a = np.arange(16, dtype=np.int32).reshape(1, 16)
    b = np.ones((1, 16), dtype=np.int32)
    inputs = [httpclient.InferInput("INPUT0", [1, 16], "INT32"),
              httpclient.InferInput("INPUT1", [1, 16], "INT32")]
    inputs[0].set_data_from_numpy(a, binary_data=binary)
    inputs[1].set_data_from_numpy(b, binary_data=False)
    outputs = [httpclient.InferRequestedOutput("OUTPUT0", binary_data=binary),
               httpclient.InferRequestedOutput("OUTPUT1", binary_data=False)]
    body, header_length = httpclient.InferenceServerClient.generate_request_body(
        inputs, outputs=outputs)
    return body, header_length, a, b


def check_simple_json(body, a, b):
    answer = json.loads(body)
    assert answer["model_name"] == "simple"
    out = {o["name"]: o for o in answer["outputs"]}
    assert out["OUTPUT0"]["data"] == (a + b).flatten().tolist()
    assert out["OUTPUT1"]["data"] == (a - b).flatten().tolist()


def check_simple_binary(body, header_length, a, b):
    result = httpclient.InferenceServerClient.parse_response_body(
        body, header_length=header_length)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - b)
