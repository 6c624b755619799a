"""Ragged batching, batch inputs and batch outputs (Triton's
`allow_ragged_batch`, `batch_input`, `batch_output`; server
docs/user_guide/ragged_batching.md, qa/L0_batch_input) on ONNX Runtime,
over HTTP and gRPC.

The model, generated here, echoes what the server computed for the batch:
RAGGED_INPUT arrives as the batch's requests flattened into one 1-D tensor
and goes back through a BATCH_SCATTER_WITH_INPUT_SHAPE batch output; every
kind of batch input is broadcast to one row per request (so each request
sees the whole batch's vector), except BATCH_ITEM_SHAPE, whose rows are
split per request. `preferred_batch_size: [4]` with a 30 s queue delay
makes every four concurrent requests exactly one execution."""

import queue
import shutil

import numpy as np
import onnx
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from onnx import TensorProto, helper
from tritonclient.utils import InferenceServerException

from serverproc import ROOT, ServerProcess

LENGTHS = [2, 4, 1, 3]
BROADCAST = {  # output: (batch input target, its kind, its datatype)
    "COUNT_OUT": ("COUNT", "BATCH_ELEMENT_COUNT", TensorProto.FLOAT),
    "ACC_OUT": ("ACC", "BATCH_ACCUMULATED_ELEMENT_COUNT", TensorProto.INT32),
    "ACC0_OUT": ("ACC0", "BATCH_ACCUMULATED_ELEMENT_COUNT_WITH_ZERO", TensorProto.FLOAT),
    "MAX_OUT": ("MAXSHAPE", "BATCH_MAX_ELEMENT_COUNT_AS_SHAPE", TensorProto.FLOAT),
    "FLAT_OUT": ("FLAT", "BATCH_ITEM_SHAPE_FLATTEN", TensorProto.FLOAT),
}
TYPE_NAME = {TensorProto.FLOAT: "TYPE_FP32", TensorProto.INT32: "TYPE_INT32"}


def ragged_model(ragged_dims=("n",)):
    nodes = [
        helper.make_node("Identity", ["RAGGED_INPUT"], ["RAGGED_OUT"]),
        helper.make_node("Identity", ["ITEM"], ["ITEM_OUT"]),
        helper.make_node("Shape", ["COUNT"], ["rows"]),
        helper.make_node("Constant", [], ["axes"],
                         value=helper.make_tensor("axes", TensorProto.INT64, [1], [0])),
    ]
    inputs = [
        helper.make_tensor_value_info("RAGGED_INPUT", TensorProto.FLOAT, list(ragged_dims)),
        helper.make_tensor_value_info("ITEM", TensorProto.FLOAT, ["items", 1]),
    ]
    outputs = [
        helper.make_tensor_value_info("RAGGED_OUT", TensorProto.FLOAT, list(ragged_dims)),
        helper.make_tensor_value_info("ITEM_OUT", TensorProto.FLOAT, ["items", 1]),
    ]
    for out, (src, _, dtype) in BROADCAST.items():
        # [k] -> [1, k] -> [rows, k]: one copy per request.
        nodes += [
            helper.make_node("Unsqueeze", [src, "axes"], [f"{src}_row"]),
            helper.make_node("Shape", [src], [f"{src}_len"]),
            helper.make_node("Concat", ["rows", f"{src}_len"], [f"{src}_shape"], axis=0),
            helper.make_node("Expand", [f"{src}_row", f"{src}_shape"], [out]),
        ]
        inputs.append(helper.make_tensor_value_info(src, dtype, [f"{src}_k"]))
        outputs.append(helper.make_tensor_value_info(out, dtype, ["b", f"{out}_k"]))
    graph = helper.make_graph(nodes, "ragged_batch", inputs, outputs)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model.SerializeToString()


def ragged_config(name, scheduling, extra=""):
    batch_inputs = [
        f'{{ kind: {kind} target_name: "{src}" data_type: {TYPE_NAME[dtype]} '
        f'source_input: "RAGGED_INPUT" }}'
        for src, kind, dtype in BROADCAST.values()
    ]
    batch_inputs.append('{ kind: BATCH_ITEM_SHAPE target_name: "ITEM" data_type: TYPE_FP32 '
                        'source_input: "RAGGED_INPUT" }')
    outputs = [f'{{ name: "{o}" data_type: {TYPE_NAME[d]} dims: [ -1 ] }}'
               for o, (_, _, d) in BROADCAST.items()]
    outputs += ['{ name: "RAGGED_OUT" data_type: TYPE_FP32 dims: [ -1 ] }',
                '{ name: "ITEM_OUT" data_type: TYPE_FP32 dims: [ 1 ] }']
    return f"""
name: "{name}"
backend: "onnxruntime"
max_batch_size: 4
input [ {{ name: "RAGGED_INPUT" data_type: TYPE_FP32 dims: [ -1 ] allow_ragged_batch: true }} ]
output [ {", ".join(outputs)} ]
batch_input [ {", ".join(batch_inputs)} ]
batch_output [ {{ target_name: "RAGGED_OUT" kind: BATCH_SCATTER_WITH_INPUT_SHAPE source_input: "RAGGED_INPUT" }} ]
instance_group [ {{ count: 1 kind: KIND_CPU }} ]
{scheduling}
{extra}
"""


def write_model(repo, name, config, onnx_bytes):
    (repo / name / "1").mkdir(parents=True)
    (repo / name / "config.pbtxt").write_text(config)
    (repo / name / "1" / "model.onnx").write_bytes(onnx_bytes)


BATCHED = "dynamic_batching { preferred_batch_size: [ 4 ] max_queue_delay_microseconds: 30000000 }"


@pytest.fixture(scope="module")
def ragged_server(tmp_path_factory):
    repo = tmp_path_factory.mktemp("ragged-repo")
    model = ragged_model()
    for protocol in ("http", "grpc"):
        write_model(repo, f"ragged_{protocol}", ragged_config(f"ragged_{protocol}", BATCHED), model)
    # The default scheduler: one request per execution, still flattened.
    write_model(repo, "ragged_single", ragged_config("ragged_single", ""), model)
    server = ServerProcess([repo], log="python-ragged-server.log", ready_timeout_s=120)
    yield server
    server.stop_expecting_success()


def request_data(n):
    return np.arange(100 * n, 100 * n + n, dtype=np.float32).reshape(1, n)


def check_request(result, n, batch_lengths):
    """One request's outputs, given the lengths of its batch's requests in
    the order the server batched them."""
    np.testing.assert_array_equal(result.as_numpy("RAGGED_OUT"), request_data(n))
    np.testing.assert_array_equal(result.as_numpy("ITEM_OUT"), [[n]])
    counts = np.asarray(batch_lengths)
    expect = {
        "COUNT_OUT": counts.astype(np.float32),
        "ACC_OUT": np.cumsum(counts).astype(np.int32),
        "ACC0_OUT": np.concatenate([[0], np.cumsum(counts)]).astype(np.float32),
        "FLAT_OUT": counts.astype(np.float32),
    }
    for name, values in expect.items():
        got = result.as_numpy(name)
        assert got.dtype == values.dtype, name
        np.testing.assert_array_equal(got, values.reshape(1, -1), err_msg=name)
    assert result.as_numpy("MAX_OUT").shape == (1, max(batch_lengths))


def stats(client, model, protocol):
    s = client.get_inference_statistics(model, as_json=True) if protocol == "grpc" \
        else client.get_inference_statistics(model)
    m = s["model_stats"][0]
    return int(m.get("inference_count", 0)), int(m.get("execution_count", 0))


def test_ragged_batch_over_http(ragged_server):
    client = httpclient.InferenceServerClient(ragged_server.http_url, concurrency=len(LENGTHS))
    before = stats(client, "ragged_http", "http")
    for _ in range(2):
        pending = []
        for n in LENGTHS:
            inp = httpclient.InferInput("RAGGED_INPUT", [1, n], "FP32")
            inp.set_data_from_numpy(request_data(n))
            pending.append((n, client.async_infer("ragged_http", [inp])))
        results = [(n, p.get_result(timeout=120)) for n, p in pending]
        # Arrival order decides the batch's order: read it from the answers,
        # then check every answer against it.
        order = [int(v) for v in results[0][1].as_numpy("COUNT_OUT")[0]]
        assert sorted(order) == sorted(LENGTHS)
        for n, result in results:
            check_request(result, n, order)
    after = stats(client, "ragged_http", "http")
    assert after[0] - before[0] == 8
    assert after[1] - before[1] == 2, "every four requests must run as one execution"
    client.close()


def test_ragged_batch_over_grpc_stream_in_order(ragged_server):
    client = grpcclient.InferenceServerClient(ragged_server.grpc_url)
    answers = queue.Queue()
    client.start_stream(callback=lambda result, error: answers.put((result, error)))
    try:
        for i, n in enumerate(LENGTHS):
            inp = grpcclient.InferInput("RAGGED_INPUT", [1, n], "FP32")
            inp.set_data_from_numpy(request_data(n))
            client.async_stream_infer("ragged_grpc", [inp], request_id=str(i))
        by_id = {}
        for _ in LENGTHS:
            result, error = answers.get(timeout=120)
            assert error is None, error
            by_id[result.get_response().id] = result
    finally:
        client.stop_stream()
    # A stream dispatches in order, so the batch is in sending order, as
    # Triton's qa/L0_batch_input expects ([2, 6, 7, 10] and so on).
    for i, n in enumerate(LENGTHS):
        check_request(by_id[str(i)], n, LENGTHS)
    assert stats(client, "ragged_grpc", "grpc") == (4, 1)
    client.close()


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_lone_request_is_flattened_too(ragged_server, protocol):
    module = httpclient if protocol == "http" else grpcclient
    url = ragged_server.http_url if protocol == "http" else ragged_server.grpc_url
    client = module.InferenceServerClient(url)
    inp = module.InferInput("RAGGED_INPUT", [1, 3], "FP32")
    inp.set_data_from_numpy(request_data(3))
    check_request(client.infer("ragged_single", [inp]), 3, [3])
    # A request of two rows: two item shapes, one element count for it.
    inp = module.InferInput("RAGGED_INPUT", [2, 2], "FP32")
    data = np.arange(4, dtype=np.float32).reshape(2, 2)
    inp.set_data_from_numpy(data)
    wanted = [module.InferRequestedOutput(o) for o in ("RAGGED_OUT", "ITEM_OUT")]
    result = client.infer("ragged_single", [inp], outputs=wanted)
    np.testing.assert_array_equal(result.as_numpy("RAGGED_OUT"), data)
    np.testing.assert_array_equal(result.as_numpy("ITEM_OUT"), [[2], [2]])
    client.close()


def load_error(server, name):
    client = httpclient.InferenceServerClient(server.http_url)
    with pytest.raises(InferenceServerException) as e:
        client.load_model(name)
    client.close()
    return str(e.value)


def test_bad_ragged_configurations_are_refused(tmp_path):
    repo = tmp_path / "repo"
    model = ragged_model()
    base = lambda name: ragged_config(name, BATCHED)
    # Triton's checks (core's ValidateBatchIO), with its texts.
    write_model(repo, "unknown_source",
                base("unknown_source").replace('source_input: "RAGGED_INPUT" }', 'source_input: "NOPE" }', 1),
                model)
    write_model(repo, "bad_type",
                base("bad_type").replace('target_name: "ACC" data_type: TYPE_INT32',
                                       'target_name: "ACC" data_type: TYPE_INT64'), model)
    write_model(repo, "unknown_target",
                base("unknown_target").replace('target_name: "RAGGED_OUT"', 'target_name: "NOPE"'), model)
    # The ONNX model must take a ragged input as [-1] (the ONNX Runtime
    # backend's check) and have every batch input's target.
    write_model(repo, "not_flat", base("not_flat"), ragged_model(ragged_dims=("b", "n")))
    write_model(repo, "no_target",
                base("no_target") + 'batch_input [ { kind: BATCH_ELEMENT_COUNT target_name: "MISSING" '
                'data_type: TYPE_FP32 source_input: "RAGGED_INPUT" } ]', model)
    # Built-in backends do not take ragged batches.
    shutil.copytree(ROOT / "models" / "simple_identity", repo / "identity_ragged")
    cfg = (repo / "identity_ragged" / "config.pbtxt").read_text()
    cfg = cfg.replace('name: "simple_identity"', 'name: "identity_ragged"')
    (repo / "identity_ragged" / "config.pbtxt").write_text(
        cfg.replace("dims: [ -1 ]", "dims: [ -1 ]\n    allow_ragged_batch: true", 1))
    # Strict: no auto-complete, so the configuration is judged before the
    # backend compares it with the ONNX model (auto-complete would find the
    # mismatches of these broken configurations first, in its own words).
    server = ServerProcess([repo], ["--model-control-mode", "explicit",
                                    "--strict-model-config", "true"],
                           log="python-ragged-bad-server.log", ready_path="/v2/health/live")
    try:
        expected = {
            "unknown_source": "unknown source input name 'NOPE' for unknown_source",
            "bad_type": "batch input data type must be TYPE_INT32 or TYPE_FP32 for bad_type",
            "unknown_target": "unknown target output name 'NOPE' for unknown_target",
            "not_flat": "configuration expects model provides input with shape [-1]  "
                        "for ragged input 'RAGGED_INPUT'",
            "no_target": "batch_input target 'MISSING' is not an input of the ONNX model",
            "identity_ragged": "not for the built-in backend 'identity'",
        }
        for name, text in expected.items():
            message = load_error(server, name)
            assert text in message, f"{name}: {message}"
        # The server keeps serving.
        assert httpclient.InferenceServerClient(server.http_url).is_server_live()
    finally:
        server.stop_expecting_success()
