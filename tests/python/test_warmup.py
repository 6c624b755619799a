"""Model warmup (`model_warmup`) through tritonclient, HTTP and gRPC: a
model is READY only after every instance ran every sample, the warmup
executions count in its statistics, and a sample that does not fit (bad
shape, missing or escaping data file, a backend error) leaves the model
UNAVAILABLE with the reason while the server keeps serving.

Built-in models only (no ONNX Runtime): a temporary repository in explicit
control mode, loaded one model at a time."""

import shutil

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from serverproc import ROOT, ServerProcess

SIMPLE_IO = """
max_batch_size: 8
input [
  { name: "INPUT0" data_type: TYPE_INT32 dims: [ 16 ] },
  { name: "INPUT1" data_type: TYPE_INT32 dims: [ 16 ] }
]
output [
  { name: "OUTPUT0" data_type: TYPE_INT32 dims: [ 16 ] },
  { name: "OUTPUT1" data_type: TYPE_INT32 dims: [ 16 ] }
]
"""

# Two instances; samples: 2 rows x 3 runs (zeros and random data), then one
# row from files. Per instance: 4 executions, 7 inferences.
GOOD_WARMUP = """
instance_group [ { count: 2, kind: KIND_CPU } ]
model_warmup [
  {
    name: "synthetic"
    batch_size: 2
    count: 3
    inputs { key: "INPUT0" value { data_type: TYPE_INT32 dims: [ 16 ] zero_data: true } }
    inputs { key: "INPUT1" value { data_type: TYPE_INT32 dims: [ 16 ] random_data: true } }
  },
  {
    name: "from_files"
    batch_size: 1
    inputs { key: "INPUT0" value { data_type: TYPE_INT32 dims: [ 16 ] input_data_file: "in0.bin" } }
    inputs { key: "INPUT1" value { data_type: TYPE_INT32 dims: [ 16 ] input_data_file: "sub/in1.bin" } }
  },
  { name: "skipped" batch_size: 0 }
]
"""


def one_sample(input0, input1="zero_data: true", batch_size=1, dtype1="TYPE_INT32"):
    return f"""
model_warmup [
  {{
    name: "sample"
    batch_size: {batch_size}
    inputs {{ key: "INPUT0" value {{ {input0} }} }}
    inputs {{ key: "INPUT1" value {{ data_type: {dtype1} dims: [ 16 ] {input1} }} }}
  }}
]
"""


INT32_16 = "data_type: TYPE_INT32 dims: [ 16 ]"

# name -> (backend, extra config, text expected in the failure reason)
BAD = {
    "warm_bad_shape": ("simple", one_sample("data_type: TYPE_INT32 dims: [ 8 ] zero_data: true"),
                       "unexpected shape for input 'INPUT0'"),
    "warm_bad_dtype": ("simple", one_sample("data_type: TYPE_FP32 dims: [ 16 ] zero_data: true"),
                       "data-type is 'FP32'"),
    "warm_variable_dims": ("simple", one_sample("data_type: TYPE_INT32 dims: [ -1 ] zero_data: true"),
                           "variable-size dimensions"),
    "warm_no_data": ("simple", one_sample(INT32_16), "input_data_type set"),
    "warm_missing_file": ("simple", one_sample(f'{INT32_16} input_data_file: "nope.bin"'),
                          "not found"),
    "warm_short_file": ("simple", one_sample(f'{INT32_16} input_data_file: "short.bin"'),
                        "only has 8 bytes"),
    "warm_escape": ("simple", one_sample(f'{INT32_16} input_data_file: "../config.pbtxt"'),
                    "must be a relative path inside the model's warmup/ folder"),
    "warm_absolute": ("simple", one_sample(f'{INT32_16} input_data_file: "/etc/passwd"'),
                      "must be a relative path inside"),
    "warm_too_big": ("simple", one_sample(INT32_16 + " zero_data: true", batch_size=9),
                     "max allowed is 8"),
    # simple_string parses each element as an INT32: empty strings (zero
    # data of a BYTES input) make the backend answer an error.
    "warm_backend_error": ("simple_string", one_sample(
        "data_type: TYPE_STRING dims: [ 16 ] zero_data: true",
        dtype1="TYPE_STRING"), "failed to run warmup sample 'sample'"),
}


def write_model(repo, name, backend, extra, io=SIMPLE_IO):
    d = repo / name
    (d / "1").mkdir(parents=True)
    (d / "warmup" / "sub").mkdir(parents=True)
    (d / "warmup" / "in0.bin").write_bytes(np.arange(16, dtype=np.int32).tobytes())
    (d / "warmup" / "sub" / "in1.bin").write_bytes(np.ones(20, dtype=np.int32).tobytes())
    (d / "warmup" / "short.bin").write_bytes(b"\0" * 8)
    (d / "config.pbtxt").write_text(f'name: "{name}"\nbackend: "{backend}"\n{io}\n{extra}\n')


@pytest.fixture(scope="module")
def warm_server(tmp_path_factory):
    repo = tmp_path_factory.mktemp("warmup-repo")
    write_model(repo, "warm_simple", "simple", GOOD_WARMUP)
    write_model(repo, "warm_simple_grpc", "simple", GOOD_WARMUP)
    for name, (backend, extra, _) in BAD.items():
        io = SIMPLE_IO.replace("TYPE_INT32", "TYPE_STRING") if backend == "simple_string" else SIMPLE_IO
        write_model(repo, name, backend, extra, io)
    shutil.copytree(ROOT / "models" / "simple", repo / "simple")
    server = ServerProcess([repo], ["--model-control-mode", "explicit", "--load-model", "simple"],
                           log="python-warmup-server.log", ready_path="/v2/health/live")
    yield server
    server.stop_expecting_success()


def stats_of(client, name):
    if isinstance(client, httpclient.InferenceServerClient):
        s = client.get_inference_statistics(name)["model_stats"][0]
    else:
        s = client.get_inference_statistics(name, as_json=True)["model_stats"][0]
    return {
        "executions": int(s.get("execution_count", 0)),
        "inferences": int(s.get("inference_count", 0)),
        "success": int(s["inference_stats"].get("success", {}).get("count", 0)),
    }


def client_for(proto, server):
    if proto == "http":
        return httpclient, httpclient.InferenceServerClient(server.http_url)
    return grpcclient, grpcclient.InferenceServerClient(server.grpc_url)


def infer_simple(module, client, name):
    a = np.arange(16, dtype=np.int32).reshape(1, 16)
    inputs = [module.InferInput("INPUT0", [1, 16], "INT32"), module.InferInput("INPUT1", [1, 16], "INT32")]
    inputs[0].set_data_from_numpy(a)
    inputs[1].set_data_from_numpy(a)
    result = client.infer(name, inputs)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + a)


def index_row(proto, client, name):
    if proto == "http":
        rows = client.get_model_repository_index()
    else:
        rows = client.get_model_repository_index(as_json=True).get("models", [])
    return next(r for r in rows if r["name"] == name)


@pytest.mark.parametrize("proto", ["http", "grpc"])
def test_model_is_ready_after_warmup_and_warmup_counts_in_statistics(warm_server, proto):
    module, client = client_for(proto, warm_server)
    name = "warm_simple" if proto == "http" else "warm_simple_grpc"
    # The load call returns once warmup is done: ready at once.
    client.load_model(name)
    assert client.is_model_ready(name)
    # 2 instances x (3 runs of the 2-row sample + 1 run of the 1-row one).
    assert stats_of(client, name) == {"executions": 8, "inferences": 14, "success": 14}
    infer_simple(module, client, name)
    assert stats_of(client, name) == {"executions": 9, "inferences": 15, "success": 15}
    client.close()


@pytest.mark.parametrize("name", sorted(BAD))
@pytest.mark.parametrize("proto", ["http", "grpc"])
def test_failing_warmup_leaves_the_model_unavailable_with_the_reason(warm_server, proto, name):
    module, client = client_for(proto, warm_server)
    expected = BAD[name][2]
    with pytest.raises(InferenceServerException) as e:
        client.load_model(name)
    assert "failed to load" in str(e.value) and expected in str(e.value), str(e.value)
    assert not client.is_model_ready(name)
    row = index_row(proto, client, name)
    assert row["state"] == "UNAVAILABLE", row
    assert expected in row.get("reason", ""), row
    # The server keeps serving.
    infer_simple(module, client, "simple")
    client.close()
