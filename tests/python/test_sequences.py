"""Stateful (sequence-batched) models through tritonclient: every sequence
model of the example repository over HTTP and gRPC, sync and asyncio, unary
and streaming, with uint64 and string correlation ids; concurrent
sequences whose requests hop between connections (and so between the
server's shards); Triton's error messages; idle release; statistics; and
Triton's own sequence client examples, vendored unchanged in
tests/python/examples/, run as subprocesses.

Expected outputs follow /work/shared/models/CONTRACTS.md (builtin models)
and scripts/gen_onnx_models.py (the ONNX implicit-state accumulators)."""

import asyncio
import concurrent.futures
import itertools
import json
import os
import pathlib
import queue
import random
import re
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.grpc.aio as grpcaio
import tritonclient.http as httpclient
import tritonclient.http.aio as httpaio
from tritonclient.grpc import service_pb2, service_pb2_grpc
from tritonclient.utils import InferenceServerException

TIMEOUT_S = 30
EXAMPLES = pathlib.Path(__file__).resolve().parent / "examples"

BUILTIN = ["simple_sequence", "simple_dyna_sequence", "simple_string_dyna_sequence", "sequence_accumulator"]
ONNX = ["sequence_accumulator_onnx", "sequence_accumulator_onnx_init", "sequence_accumulator_onnx_file"]
MODELS = BUILTIN + ONNX
# Models whose CORRID control is an integer: string ids are refused.
UINT64_CORRID = {"simple_dyna_sequence"}
# Models that need the id to be a decimal integer (also as a string).
DECIMAL_ID = {"simple_string_dyna_sequence"}

# Correlation ids unique within this session and away from the ones the
# client examples use (1000..1002).
_ids = itertools.count(random.randrange(1_000_000, 2_000_000_000, 1000))


def new_id(kind, model):
    n = next(_ids)
    if kind == "uint64":
        return n
    if model in DECIMAL_ID:
        return str(n)
    return f"seq-{n}-{uuid.uuid4().hex[:8]}"


def i32(x):
    return (int(x) + 2**31) % 2**32 - 2**31


def expected(model, values, cid):
    """OUTPUT of each request of one sequence that starts with values[0]
    and ends with values[-1]."""
    out, acc, n = [], 0, len(values)
    for i, v in enumerate(values):
        start, end = i == 0, i == n - 1
        if model == "simple_sequence":
            out.append(i32(v + start))
        elif model == "simple_dyna_sequence":
            out.append(i32(v + start + (i32(cid) if end else 0)))
        elif model == "simple_string_dyna_sequence":
            acc = v if start else acc + v
            if end:
                acc += int(cid)
            out.append(i32(acc))
        elif model == "sequence_accumulator_onnx_file":
            acc = 100 + v if start else acc + v
            out.append(i32(acc))
        else:  # running sums restarted by START
            acc = v if start else acc + v
            out.append(i32(acc))
    return out


def value_of(result):
    out = result.as_numpy("OUTPUT")
    assert out.dtype == np.int32 and out.shape == (1, 1), (out.dtype, out.shape)
    return int(out[0][0])


def make_inputs(module, value, batch=1):
    inp = module.InferInput("INPUT", [batch, 1], "INT32")
    inp.set_data_from_numpy(np.full((batch, 1), value, dtype=np.int32))
    return [inp]


def outputs(module):
    return [module.InferRequestedOutput("OUTPUT")]


def seq_kwargs(cid, i, n):
    return dict(sequence_id=cid, sequence_start=(i == 0), sequence_end=(i == n - 1))


def sequences_for(model, kind, count=3):
    """`count` (id, values) pairs with distinct values per sequence."""
    seqs = []
    for k in range(count):
        values = [7 * k + 1, -3, 10 * k, 0, 2**31 - 1 if k == 1 else 5, 1 + k]
        seqs.append((new_id(kind, model), values))
    return seqs


def check(model, seqs, got):
    for cid, values in seqs:
        assert got[cid] == expected(model, values, cid), f"{model} sequence {cid!r} values {values}"


# ---- the five ways of sending a sequence. Each runs several sequences with
# their requests interleaved and returns {id: [OUTPUT, ...]} ----


def run_http_sync(server, model, seqs):
    client = httpclient.InferenceServerClient(server.http_url)
    got = {cid: [] for cid, _ in seqs}
    try:
        for i in range(max(len(v) for _, v in seqs)):
            for cid, values in seqs:
                if i < len(values):
                    r = client.infer(model, make_inputs(httpclient, values[i]), outputs=outputs(httpclient),
                                     **seq_kwargs(cid, i, len(values)))
                    got[cid].append(value_of(r))
    finally:
        client.close()
    return got


def run_grpc_sync(server, model, seqs):
    client = grpcclient.InferenceServerClient(server.grpc_url)
    got = {cid: [] for cid, _ in seqs}
    try:
        for i in range(max(len(v) for _, v in seqs)):
            for cid, values in seqs:
                if i < len(values):
                    r = client.infer(model, make_inputs(grpcclient, values[i]), outputs=outputs(grpcclient),
                                     **seq_kwargs(cid, i, len(values)))
                    got[cid].append(value_of(r))
    finally:
        client.close()
    return got


async def _run_aio(client, module, model, seqs):
    async def one(cid, values):
        res = []
        for i, v in enumerate(values):
            r = await client.infer(model, make_inputs(module, v), outputs=outputs(module),
                                   **seq_kwargs(cid, i, len(values)))
            res.append(value_of(r))
        return cid, res

    return dict(await asyncio.gather(*[one(cid, values) for cid, values in seqs]))


def run_http_aio(server, model, seqs):
    async def main():
        client = httpaio.InferenceServerClient(server.http_url)
        try:
            return await _run_aio(client, httpaio, model, seqs)
        finally:
            await client.close()

    return asyncio.run(main())


def run_grpc_aio(server, model, seqs):
    async def main():
        client = grpcaio.InferenceServerClient(server.grpc_url)
        try:
            return await _run_aio(client, grpcaio, model, seqs)
        finally:
            await client.close()

    return asyncio.run(main())


def _stream_requests(seqs):
    """(request_id, cid, index, n, value) interleaved round-robin."""
    reqs = []
    for i in range(max(len(v) for _, v in seqs)):
        for k, (cid, values) in enumerate(seqs):
            if i < len(values):
                reqs.append((f"{k}_{i}", cid, i, len(values), values[i]))
    return reqs


def _collect_stream(seqs, pairs):
    """pairs: (request_id, value-or-exception) in arrival order."""
    got = {cid: [None] * len(values) for cid, values in seqs}
    order = {cid: [] for cid, _ in seqs}
    for rid, value in pairs:
        if isinstance(value, Exception):
            raise value
        k, i = (int(x) for x in rid.split("_"))
        cid = seqs[k][0]
        got[cid][i] = value
        order[cid].append(i)
    for cid, values in seqs:
        assert order[cid] == list(range(len(values))), f"responses of sequence {cid!r} out of order: {order[cid]}"
    return got


def run_grpc_stream(server, model, seqs):
    """One stream (sync client: start_stream + async_stream_infer) carrying
    all the sequences interleaved."""
    client = grpcclient.InferenceServerClient(server.grpc_url)
    responses = queue.Queue()
    reqs = _stream_requests(seqs)
    try:
        client.start_stream(callback=lambda result, error: responses.put((result, error)))
        for rid, cid, i, n, v in reqs:
            client.async_stream_infer(model, make_inputs(grpcclient, v), outputs=outputs(grpcclient),
                                      request_id=rid, **seq_kwargs(cid, i, n))
        pairs = []
        for _ in reqs:
            result, error = responses.get(timeout=TIMEOUT_S)
            if error is not None:
                pairs.append((None, error))
            else:
                pairs.append((result.get_response().id, value_of(result)))
        client.stop_stream()
    finally:
        client.close()
    return _collect_stream(seqs, pairs)


def run_grpc_aio_stream(server, model, seqs):
    """One aio `stream_infer` carrying all the sequences interleaved."""
    reqs = _stream_requests(seqs)

    async def main():
        client = grpcaio.InferenceServerClient(server.grpc_url)

        async def it():
            for rid, cid, i, n, v in reqs:
                yield {"model_name": model, "inputs": make_inputs(grpcaio, v), "outputs": outputs(grpcaio),
                       "request_id": rid, **seq_kwargs(cid, i, n)}

        pairs = []
        try:
            async for result, error in client.stream_infer(it(), stream_timeout=TIMEOUT_S):
                if error is not None:
                    pairs.append((None, error))
                else:
                    pairs.append((result.get_response().id, value_of(result)))
        finally:
            await client.close()
        assert len(pairs) == len(reqs), pairs
        return pairs

    return _collect_stream(seqs, asyncio.run(main()))


TRANSPORTS = {
    "http": run_http_sync,
    "grpc": run_grpc_sync,
    "http_aio": run_http_aio,
    "grpc_aio": run_grpc_aio,
    "grpc_stream": run_grpc_stream,
    "grpc_aio_stream": run_grpc_aio_stream,
}


# String ids on an integer-CORRID model are refused: test_string_id_refused_by_uint64_corrid.
@pytest.mark.parametrize(
    "model,transport,kind",
    [(m, t, k) for m in MODELS for t in TRANSPORTS for k in ("uint64", "string")
     if not (k == "string" and m in UINT64_CORRID)],
)
def test_interleaved_sequences(server, model, transport, kind):
    """Three sequences with their requests interleaved (one client, or one
    stream, or asyncio.gather on one aio client)."""
    seqs = sequences_for(model, kind)
    got = TRANSPORTS[transport](server, model, seqs)
    check(model, seqs, got)


@pytest.mark.parametrize("transport", list(TRANSPORTS))
def test_single_request_sequences(server, transport):
    """A request that is both START and END, for every model at once."""
    for model in MODELS:
        seqs = [(new_id("uint64", model), [41])]
        if model not in UINT64_CORRID:
            seqs.append((new_id("string", model), [-9]))
        check(model, seqs, TRANSPORTS[transport](server, model, seqs))


def _raises_on(transport, server, model, seqs):
    """The first error a transport reports for these sequences."""
    with pytest.raises(InferenceServerException) as e:
        TRANSPORTS[transport](server, model, seqs)
    return e.value


@pytest.mark.parametrize("transport", list(TRANSPORTS))
def test_string_id_refused_by_uint64_corrid(server, transport):
    model = "simple_dyna_sequence"
    err = _raises_on(transport, server, model, [(f"s{next(_ids)}", [1, 2])])
    assert (
        "sequence batching control 'CORRID' data-type is 'BYTES', but model 'simple_dyna_sequence' expects 'UINT64'"
        in err.message()
    ), err.message()
    # A decimal string is still a string.
    err = _raises_on(transport, server, model, [(str(next(_ids)), [1])])
    assert "expects 'UINT64'" in err.message(), err.message()
    seqs = sequences_for(model, "uint64", 2)
    check(model, seqs, TRANSPORTS[transport](server, model, seqs))


def test_uint64_ids_beyond_32_and_63_bits(server):
    """int32(CORRID) is the low 32 bits of the id (simple_dyna_sequence);
    a JSON number carries ids up to 2**64 - 1."""
    model = "simple_dyna_sequence"
    base = next(_ids)
    for cid in (2**32 + 5, 2**33 - 3, 2**62 + base):
        seqs = [(cid, [4, 6])]
        check(model, seqs, run_grpc_sync(server, model, seqs))
        check(model, seqs, run_http_sync(server, model, seqs))
    # Over 2**63: tritonclient's HTTP client would send it too, raw JSON here.
    big = 2**64 - 1 - base
    for start, end, value in ((True, False, 10), (False, True, 20)):
        body = {"parameters": {"sequence_id": big, "sequence_start": start, "sequence_end": end},
                "inputs": [{"name": "INPUT", "shape": [1, 1], "datatype": "INT32", "data": [value]}]}
        status, resp = _http_json(server, model, body)
        assert status == 200, resp
        assert resp["outputs"][0]["data"] == [expected(model, [10, 20], big)[0 if start else 1]], resp


@pytest.mark.parametrize("model", ["sequence_accumulator", "simple_dyna_sequence"])
def test_grpc_negative_int64_sequence_id_is_the_uint64_id(server, model):
    """Triton's gRPC front end reads `sequence_id` from int64_param and hands
    it to TRITONSERVER_InferenceRequestSetCorrelationId(uint64_t): a negative
    int64 is the uint64 with the same bits. That is how Triton's C++ client
    (and perf_analyzer) send uint64 ids >= 2**63 (set_int64_param(uint64)),
    so a sequence started over HTTP with id 2**64 - k continues over gRPC
    with int64_param -k."""
    k = 1000 + next(_ids) % 1000
    big = 2**64 - k
    body = {"parameters": {"sequence_id": big, "sequence_start": True},
            "inputs": [{"name": "INPUT", "shape": [1, 1], "datatype": "INT32", "data": [10]}]}
    status, resp = _http_json(server, model, body)
    assert status == 200, resp
    values = [10, 5, 7]
    exp = expected(model, values, big)
    assert resp["outputs"][0]["data"] == [exp[0]]
    channel, stub = _stub(server)
    try:
        for i in (1, 2):
            req = _raw_grpc_request(model, values[i])
            req.parameters["sequence_id"].int64_param = -k
            req.parameters["sequence_end"].bool_param = i == 2
            try:
                resp = stub.ModelInfer(req, timeout=TIMEOUT_S)
            except grpc.RpcError as e:
                # End the sequence over HTTP so that it does not hold a slot.
                body["parameters"] = {"sequence_id": big, "sequence_end": True}
                _http_json(server, model, body)
                pytest.fail(f"int64_param sequence_id {-k} (uint64 {big}) refused: {e.code()} {e.details()}")
            got = int(np.frombuffer(resp.raw_output_contents[0], dtype=np.int32)[0])
            assert got == exp[i], (i, got, exp)
    finally:
        channel.close()


def test_integer_and_string_ids_are_different_sequences(server):
    model = "sequence_accumulator"
    n = next(_ids)
    http = httpclient.InferenceServerClient(server.http_url)
    grpc_c = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        def send(client, module, cid, v, start=False, end=False):
            return value_of(client.infer(model, make_inputs(module, v), sequence_id=cid,
                                         sequence_start=start, sequence_end=end))

        assert send(http, httpclient, n, 5, start=True) == 5
        assert send(grpc_c, grpcclient, str(n), 100, start=True) == 100
        assert send(grpc_c, grpcclient, n, 1) == 6
        assert send(http, httpclient, str(n), 2) == 102
        # The same id on another model is yet another sequence.
        other = value_of(http.infer("sequence_accumulator_onnx", make_inputs(httpclient, 50), sequence_id=n,
                                    sequence_start=True, sequence_end=True))
        assert other == 50
        # START on an active sequence starts it afresh.
        assert send(grpc_c, grpcclient, n, 10, start=True) == 10
        assert send(http, httpclient, n, 1, end=True) == 11
        assert send(http, httpclient, str(n), 3, end=True) == 105
    finally:
        http.close()
        grpc_c.close()


def test_string_dyna_sequence_non_decimal_id_fails_only_that_request(server):
    model = "simple_string_dyna_sequence"
    c = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        with pytest.raises(InferenceServerException):
            c.infer(model, make_inputs(grpcclient, 1), sequence_id=f"x-{uuid.uuid4().hex}",
                    sequence_start=True, sequence_end=True)
        seqs = sequences_for(model, "string", 2)
        check(model, seqs, run_grpc_sync(server, model, seqs))
    finally:
        c.close()


def test_metadata_and_config_of_sequence_models(server):
    """Control and state tensors are the batcher's, not the client's:
    metadata lists only INPUT/OUTPUT; the config shows sequence_batching."""
    g = grpcclient.InferenceServerClient(server.grpc_url)
    h = httpclient.InferenceServerClient(server.http_url)
    try:
        for model in MODELS:
            meta = h.get_model_metadata(model)
            assert [i["name"] for i in meta["inputs"]] == ["INPUT"], (model, meta)
            assert meta["inputs"][0]["shape"] == [-1, 1] and meta["inputs"][0]["datatype"] == "INT32"
            assert "OUTPUT" in [o["name"] for o in meta["outputs"]]
        cfg = g.get_model_config("simple_dyna_sequence").config
        assert cfg.sequence_batching.oldest.max_candidate_sequences == 1024
        assert cfg.sequence_batching.max_sequence_idle_microseconds == 10_000_000
        assert [c.name for c in cfg.sequence_batching.control_input] == ["START", "END", "READY", "CORRID"]
        cfg = h.get_model_config("sequence_accumulator")
        assert int(cfg["sequence_batching"]["max_sequence_idle_microseconds"]) == 5_000_000
        assert "direct" in cfg["sequence_batching"]
    finally:
        g.close()
        h.close()


def test_sequence_parameters_on_a_stateless_model_are_ignored(server):
    """Triton serves a request carrying sequence parameters to a model
    without sequence batching like any other request."""
    inputs = [httpclient.InferInput("INPUT0", [1, 16], "INT32"), httpclient.InferInput("INPUT1", [1, 16], "INT32")]
    a = np.arange(16, dtype=np.int32).reshape(1, 16)
    for i in inputs:
        i.set_data_from_numpy(a)
    h = httpclient.InferenceServerClient(server.http_url)
    try:
        for kw in ({"sequence_id": 5, "sequence_start": True}, {"sequence_id": "abc", "sequence_end": True},
                   {"sequence_id": 77}):
            np.testing.assert_array_equal(h.infer("simple", inputs, **kw).as_numpy("OUTPUT0"), a + a)
    finally:
        h.close()


# ---- concurrency across connections and shards ----


def _forwarded_total(server):
    body = urllib.request.urlopen(f"http://{server.metrics_url}/metrics", timeout=5).read().decode()
    vals = re.findall(r"^shardserve_forwarded_requests_total\{[^}]*\} (\d+)", body, re.M)
    assert vals, "shardserve_forwarded_requests_total missing from /metrics"
    return sum(int(v) for v in vals)


def _shard_count(server):
    body = urllib.request.urlopen(f"http://{server.metrics_url}/metrics", timeout=5).read().decode()
    return len(set(re.findall(r'^shardserve_shard_connections\{shard="(\d+)"\}', body, re.M)))


def test_fixture_server_has_several_shards(server):
    # The cross-shard tests below rely on the session server's `--cores 2`.
    assert _shard_count(server) >= 2


N_CONCURRENT = 10  # more than the 8 slots of a direct model: some wait in the backlog


@pytest.mark.parametrize("model", MODELS)
def test_concurrent_sequences_hop_connections_and_shards(server, model):
    """Sequences in parallel threads; each request of a sequence goes out on
    the next of three client objects (HTTP, gRPC, HTTP: three connections),
    so consecutive requests of one sequence arrive on different shards."""
    kinds = ["uint64", "string"] if model not in UINT64_CORRID else ["uint64"]
    seqs = []
    for k in range(N_CONCURRENT):
        kind = kinds[k % len(kinds)]
        seqs.append((new_id(kind, model), [k + 1, 100 * k, -k, 3, 2**31 - 1 if k == 3 else k, 1000 + k, 7]))

    def one(seq):
        cid, values = seq
        clients = [
            (httpclient, httpclient.InferenceServerClient(server.http_url)),
            (grpcclient, grpcclient.InferenceServerClient(server.grpc_url)),
            (httpclient, httpclient.InferenceServerClient(server.http_url)),
        ]
        try:
            res = []
            for i, v in enumerate(values):
                module, c = clients[i % len(clients)]
                r = c.infer(model, make_inputs(module, v), outputs=outputs(module), **seq_kwargs(cid, i, len(values)))
                res.append(value_of(r))
            return cid, res
        finally:
            for _, c in clients:
                c.close()

    http = httpclient.InferenceServerClient(server.http_url)
    stats = lambda: http.get_inference_statistics(model)["model_stats"][0]
    stats_before = stats()
    before = _forwarded_total(server)
    with concurrent.futures.ThreadPoolExecutor(N_CONCURRENT) as pool:
        got = dict(pool.map(one, seqs))
    check(model, seqs, got)
    after = _forwarded_total(server)
    assert after > before, "no request crossed shards: the sequences never left their home shard?"
    stats_after = stats()
    http.close()
    requests = sum(len(v) for _, v in seqs)
    assert stats_after["inference_count"] - stats_before["inference_count"] == requests
    executions = stats_after["execution_count"] - stats_before["execution_count"]
    assert 1 <= executions <= requests
    if model in ("simple_dyna_sequence", "simple_string_dyna_sequence"):
        # oldest strategy, 10 ms max_queue_delay: concurrent sequences share executions
        assert executions < requests, (executions, requests)


@pytest.mark.asyncio
@pytest.mark.parametrize("model", MODELS)
async def test_concurrent_sequences_asyncio_gather(server, model):
    """asyncio.gather over sequences; request i of every sequence goes out on
    client i % 4 (HTTP aio, gRPC aio, HTTP aio, gRPC aio, shared by all)."""
    kinds = ["uint64", "string"] if model not in UINT64_CORRID else ["uint64"]
    seqs = [(new_id(kinds[k % len(kinds)], model), [k, 2 * k + 1, -5, 9, k * k]) for k in range(N_CONCURRENT)]
    clients = [
        (httpaio, httpaio.InferenceServerClient(server.http_url)),
        (grpcaio, grpcaio.InferenceServerClient(server.grpc_url)),
        (httpaio, httpaio.InferenceServerClient(server.http_url)),
        (grpcaio, grpcaio.InferenceServerClient(server.grpc_url)),
    ]

    async def one(k, cid, values):
        res = []
        for i, v in enumerate(values):
            module, c = clients[(i + k) % len(clients)]
            r = await c.infer(model, make_inputs(module, v), outputs=outputs(module), **seq_kwargs(cid, i, len(values)))
            res.append(value_of(r))
        return cid, res

    try:
        got = dict(await asyncio.gather(*[one(k, cid, values) for k, (cid, values) in enumerate(seqs)]))
    finally:
        for _, c in clients:
            await c.close()
    check(model, seqs, got)


def test_several_streams_at_once(server):
    """Three gRPC streams (three connections) each carrying interleaved
    sequences of every model, all running at the same time."""
    jobs = []
    for model in MODELS:
        kind = "uint64" if model in UINT64_CORRID else "string"
        jobs.append((model, sequences_for(model, kind, 2)))
        jobs.append((model, sequences_for(model, "uint64", 2)))
    with concurrent.futures.ThreadPoolExecutor(6) as pool:
        futures = [pool.submit(run_grpc_stream if k % 2 else run_grpc_aio_stream, server, model, seqs)
                   for k, (model, seqs) in enumerate(jobs)]
        for (model, seqs), f in zip(jobs, futures):
            check(model, seqs, f.result(timeout=60))


@pytest.mark.parametrize("model", ["simple_sequence", "sequence_accumulator", "sequence_accumulator_onnx"])
def test_direct_backlog_waits_for_a_free_slot(server, model):
    """Direct strategy, 1 instance x max_batch_size 8 = 8 slots. On one
    stream: 8 sequences take every slot, a 9th START must wait in the backlog
    (not fail, not hold up the stream) until sequence 0 ends, then run in the
    freed slot from a fresh state."""
    seqs = [(new_id("uint64" if k % 2 else "string", model), []) for k in range(9)]
    plan = [(k, 10 * k + 1) for k in range(9)]  # 8 STARTs fill the slots; the 9th waits
    plan += [(0, 1)]  # END of sequence 0 frees a slot
    plan += [(8, 5)] + [(k, 2) for k in range(1, 9)]  # everyone else finishes
    for k, v in plan:
        seqs[k][1].append(v)
    seen = [0] * 9
    reqs = []
    for k, v in plan:
        cid, values = seqs[k]
        i = seen[k]
        seen[k] += 1
        reqs.append((f"{k}_{i}", cid, i, len(values), v))

    client = grpcclient.InferenceServerClient(server.grpc_url)
    responses = queue.Queue()
    try:
        client.start_stream(callback=lambda result, error: responses.put((result, error)))
        for rid, cid, i, n, v in reqs:
            client.async_stream_infer(model, make_inputs(grpcclient, v), outputs=outputs(grpcclient),
                                      request_id=rid, **seq_kwargs(cid, i, n))
        pairs = []
        for _ in reqs:
            result, error = responses.get(timeout=TIMEOUT_S)
            pairs.append((None, error) if error is not None else (result.get_response().id, value_of(result)))
        client.stop_stream()
    finally:
        client.close()
    arrival = [rid for rid, _ in pairs]
    check(model, seqs, _collect_stream(seqs, pairs))
    assert arrival.index("8_0") > arrival.index("0_1"), f"9th sequence ran before a slot was free: {arrival}"


# ---- errors, with Triton's messages; the server keeps serving ----


def _http_json(server, model, body):
    req = urllib.request.Request(f"http://{server.http_url}/v2/models/{model}/infer", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=TIMEOUT_S) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def _stub(server):
    channel = grpc.insecure_channel(server.grpc_url)
    return channel, service_pb2_grpc.GRPCInferenceServiceStub(channel)


def _raw_grpc_request(model, value, batch=1):
    req = service_pb2.ModelInferRequest(model_name=model)
    t = req.inputs.add(name="INPUT", datatype="INT32", shape=[batch, 1])
    t.contents.int_contents.extend([value] * batch)
    return req


SYNC_CLIENTS = {
    "http": (httpclient, lambda s: httpclient.InferenceServerClient(s.http_url), "400"),
    "grpc": (grpcclient, lambda s: grpcclient.InferenceServerClient(s.grpc_url), "StatusCode.INVALID_ARGUMENT"),
}


@pytest.mark.parametrize("proto", list(SYNC_CLIENTS))
@pytest.mark.parametrize("model", BUILTIN + ["sequence_accumulator_onnx_init"])
def test_missing_start_is_refused(server, model, proto):
    module, make, status = SYNC_CLIENTS[proto]
    c = make(server)
    try:
        for kind in ("uint64", "string"):
            if kind == "string" and model in UINT64_CORRID:
                continue
            cid = new_id(kind, model)
            for _ in range(2):  # the refused request did not start the sequence
                with pytest.raises(InferenceServerException) as e:
                    c.infer(model, make_inputs(module, 1), sequence_id=cid, sequence_start=False)
                assert (
                    f"inference request for sequence {cid} to model '{model}' must specify the START flag "
                    "on the first request of the sequence" in e.value.message()
                ), e.value.message()
                assert e.value.status() == status
            # After END the id is unknown again.
            assert c.infer(model, make_inputs(module, 1), sequence_id=cid, sequence_start=True,
                           sequence_end=True) is not None
            with pytest.raises(InferenceServerException, match="must specify the START flag"):
                c.infer(model, make_inputs(module, 1), sequence_id=cid, sequence_end=True)
    finally:
        c.close()
    seqs = sequences_for(model, "uint64", 2)
    check(model, seqs, run_http_sync(server, model, seqs))


NO_ID = "must specify a non-zero or non-empty correlation ID"


@pytest.mark.parametrize("model", BUILTIN)
def test_missing_or_zero_correlation_id_is_refused(server, model):
    msg = f"inference request to model '{model}' {NO_ID}"
    # tritonclient leaves the sequence parameters out for id 0.
    for module, make, status in SYNC_CLIENTS.values():
        c = make(server)
        try:
            for kw in ({}, {"sequence_id": 0, "sequence_start": True}, {"sequence_id": "", "sequence_start": True}):
                with pytest.raises(InferenceServerException) as e:
                    c.infer(model, make_inputs(module, 1), **kw)
                assert msg in e.value.message(), e.value.message()
                assert e.value.status() == status
        finally:
            c.close()
    # Explicit zero and empty ids on the wire.
    for sid in (0, ""):
        body = {"parameters": {"sequence_id": sid, "sequence_start": True, "sequence_end": True},
                "inputs": [{"name": "INPUT", "shape": [1, 1], "datatype": "INT32", "data": [1]}]}
        status, resp = _http_json(server, model, body)
        assert status == 400 and msg in resp.get("error", ""), (sid, status, resp)
    channel, stub = _stub(server)
    try:
        for field, sid in (("int64_param", 0), ("string_param", "")):
            req = _raw_grpc_request(model, 1)
            setattr(req.parameters["sequence_id"], field, sid)
            req.parameters["sequence_start"].bool_param = True
            with pytest.raises(grpc.RpcError) as e:
                stub.ModelInfer(req, timeout=TIMEOUT_S)
            assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT, (field, e.value)
            assert msg in e.value.details(), (field, e.value.details())
    finally:
        channel.close()
    seqs = sequences_for(model, "uint64", 2)
    check(model, seqs, run_grpc_sync(server, model, seqs))


@pytest.mark.parametrize("proto", list(SYNC_CLIENTS))
@pytest.mark.parametrize("model", BUILTIN + ONNX)
def test_batch_size_two_is_refused(server, model, proto):
    module, make, status = SYNC_CLIENTS[proto]
    c = make(server)
    msg = f"inference request to model '{model}' must specify batch-size 1 due to requirements of sequence batcher"
    try:
        cid = new_id("uint64", model)
        with pytest.raises(InferenceServerException) as e:
            c.infer(model, make_inputs(module, 1, batch=2), sequence_id=cid, sequence_start=True, sequence_end=True)
        assert msg in e.value.message(), e.value.message()
        assert e.value.status() == status
        # A bad request in the middle of a sequence leaves the sequence as it was.
        vals = [5, 3, 4]
        exp = expected(model, vals, cid)
        assert value_of(c.infer(model, make_inputs(module, vals[0]), sequence_id=cid, sequence_start=True)) == exp[0]
        with pytest.raises(InferenceServerException) as e:
            c.infer(model, make_inputs(module, 9, batch=2), sequence_id=cid)
        assert msg in e.value.message(), e.value.message()
        assert value_of(c.infer(model, make_inputs(module, vals[1]), sequence_id=cid)) == exp[1]
        assert value_of(c.infer(model, make_inputs(module, vals[2]), sequence_id=cid, sequence_end=True)) == exp[2]
    finally:
        c.close()


def test_errors_on_streams_do_not_end_them(server):
    """Each refused request is answered on the stream with Triton's message;
    the sequences around them complete."""
    model = "sequence_accumulator"
    client = grpcclient.InferenceServerClient(server.grpc_url)
    responses = queue.Queue()
    good = new_id("uint64", model)
    missing_start = new_id("uint64", model)
    try:
        client.start_stream(callback=lambda result, error: responses.put((result, error)))
        send = lambda rid, v, batch=1, **kw: client.async_stream_infer(
            model, make_inputs(grpcclient, v, batch), request_id=rid, **kw)
        send("g0", 4, sequence_id=good, sequence_start=True)
        send("e-start", 1, sequence_id=missing_start)
        send("g1", 5, sequence_id=good)
        send("e-noid", 1)
        send("e-batch", 1, batch=2, sequence_id=good)
        send("g2", 6, sequence_id=good, sequence_end=True)
        got, errors = {}, []
        for _ in range(6):
            result, error = responses.get(timeout=TIMEOUT_S)
            if error is not None:
                errors.append(error.message())
            else:
                got[result.get_response().id] = value_of(result)
        client.stop_stream()
    finally:
        client.close()
    assert got == {"g0": 4, "g1": 9, "g2": 15}, (got, errors)
    assert len(errors) == 3, errors
    joined = "\n".join(errors)
    assert f"inference request for sequence {missing_start} to model '{model}' must specify the START flag" in joined
    assert f"inference request to model '{model}' {NO_ID}" in joined
    assert "must specify batch-size 1 due to requirements of sequence batcher" in joined


# ---- idle release ----


def test_idle_sequences_are_released(server):
    """COST: sleeps ~5.6 s once. Every model here has max_sequence_idle 5 s
    (the shortest in the repository; the dyna models have 10 s), so all of
    them are checked within one sleep: sequence A is touched at t=0 only and
    must be released (a later request without START is refused), sequence B
    is touched again at t~3 s and must still be alive at t~5.6 s."""
    models = ["simple_sequence", "sequence_accumulator", "sequence_accumulator_onnx",
              "sequence_accumulator_onnx_init", "sequence_accumulator_onnx_file"]
    c = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        ids = {m: (new_id("uint64", m), new_id("string", m)) for m in models}
        for m, (a, b) in ids.items():
            assert value_of(c.infer(m, make_inputs(grpcclient, 2), sequence_id=a, sequence_start=True)) == \
                expected(m, [2, 0], a)[0]
            assert value_of(c.infer(m, make_inputs(grpcclient, 3), sequence_id=b, sequence_start=True)) == \
                expected(m, [3, 0], b)[0]
        # Timed from the last touch, not the first: on a busy machine the
        # loop above may take a while, and every A must be idle 5 s.
        last_a = time.monotonic()
        time.sleep(3.0)
        first_b = time.monotonic()
        for m, (a, b) in ids.items():
            assert value_of(c.infer(m, make_inputs(grpcclient, 4), sequence_id=b)) == expected(m, [3, 4, 0], b)[1]
        time.sleep(max(0.0, last_a + 5.6 - time.monotonic()))
        # Leaves the checks below a second before the first B is 5 s idle.
        assert time.monotonic() - first_b < 4.0, "B's check came too late to prove anything"
        for m, (a, b) in ids.items():
            with pytest.raises(InferenceServerException) as e:
                c.infer(m, make_inputs(grpcclient, 1), sequence_id=a, sequence_end=True)
            assert f"inference request for sequence {a} to model '{m}' must specify the START flag" in \
                e.value.message(), (m, e.value.message())
            assert value_of(c.infer(m, make_inputs(grpcclient, 5), sequence_id=b, sequence_end=True)) == \
                expected(m, [3, 4, 5], b)[2], m
            # The released id can start afresh.
            assert value_of(c.infer(m, make_inputs(grpcclient, 6), sequence_id=a, sequence_start=True,
                                    sequence_end=True)) == expected(m, [6], a)[0]
    finally:
        c.close()


# ---- statistics ----


@pytest.mark.parametrize("model", MODELS)
def test_statistics_count_each_request_of_a_sequence(server, model):
    http = httpclient.InferenceServerClient(server.http_url)
    try:
        stats = lambda: http.get_inference_statistics(model)["model_stats"][0]
        before = stats()
        values = [1, 2, 3, 4, 5]
        seqs = [(new_id("uint64", model), values)]
        check(model, seqs, run_http_sync(server, model, seqs))
        after = stats()
        n = len(values)
        assert after["inference_count"] - before["inference_count"] == n, (before, after)
        executions = after["execution_count"] - before["execution_count"]
        assert 1 <= executions <= n, (before, after)
        assert after["inference_stats"]["success"]["count"] - before["inference_stats"]["success"]["count"] == n
    finally:
        http.close()


# ---- Triton's own client examples, unchanged ----

EXAMPLE_SCRIPTS = {
    "simple_http_sequence_sync_infer_client.py": "http",
    "simple_grpc_sequence_sync_infer_client.py": "grpc",
    "simple_grpc_sequence_stream_infer_client.py": "grpc",
    "simple_grpc_aio_sequence_stream_infer_client.py": "grpc",
}


@pytest.mark.parametrize("dyna", [False, True], ids=["plain", "dyna"])
@pytest.mark.parametrize("script", list(EXAMPLE_SCRIPTS))
def test_triton_sequence_example(server, script, dyna):
    url = server.http_url if EXAMPLE_SCRIPTS[script] == "http" else server.grpc_url
    cmd = [sys.executable, str(EXAMPLES / script), "-u", url] + (["-d"] if dyna else [])
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=60, cwd=EXAMPLES,
                       env={**os.environ, "PYTHONUNBUFFERED": "1"})
    out = p.stdout + p.stderr
    assert p.returncode == 0, out
    assert re.search(r"^PASS", p.stdout, re.M), out


def test_output_state_can_be_requested_where_listed(server):
    """sequence_accumulator_onnx_file lists OUTPUT_STATE as an output: a
    client may request it (equal to OUTPUT); sequence_accumulator_onnx does
    not list it, and asking for it is a request error."""
    model = "sequence_accumulator_onnx_file"
    c = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        cid = new_id("string", model)
        values = [7, 7, -20]
        exp = expected(model, values, cid)
        for i, v in enumerate(values):
            requested = [grpcclient.InferRequestedOutput("OUTPUT_STATE")] + (
                [grpcclient.InferRequestedOutput("OUTPUT")] if i % 2 else [])
            r = c.infer(model, make_inputs(grpcclient, v), outputs=requested, **seq_kwargs(cid, i, len(values)))
            names = [o.name for o in r.get_response().outputs]
            assert sorted(names) == sorted(o.name() for o in requested), names
            assert int(r.as_numpy("OUTPUT_STATE")[0][0]) == exp[i]
            if i % 2:
                assert value_of(r) == exp[i]
        cid = new_id("uint64", model)
        r = c.infer(model, make_inputs(grpcclient, 1), sequence_id=cid, sequence_start=True, sequence_end=True)
        assert sorted(o.name for o in r.get_response().outputs) == ["OUTPUT", "OUTPUT_STATE"]
        with pytest.raises(InferenceServerException, match="unexpected inference output 'OUTPUT_STATE'"):
            c.infer("sequence_accumulator_onnx", make_inputs(grpcclient, 1),
                    outputs=[grpcclient.InferRequestedOutput("OUTPUT_STATE")], sequence_id=cid,
                    sequence_start=True, sequence_end=True)
    finally:
        c.close()


@pytest.mark.parametrize("model", ["sequence_accumulator", "simple_string_dyna_sequence", "sequence_accumulator_onnx"])
def test_sequence_outlives_the_stream_that_started_it(server, model):
    """A sequence belongs to its correlation id, not to a connection: started
    on a stream that is then closed, continued over HTTP and gRPC aio, ended
    on a new stream."""
    cid = new_id("string", model)
    values = [3, 4, 5, 6]
    exp = expected(model, values, cid)

    def on_stream(i):
        c = grpcclient.InferenceServerClient(server.grpc_url)
        q = queue.Queue()
        try:
            c.start_stream(callback=lambda result, error: q.put((result, error)))
            c.async_stream_infer(model, make_inputs(grpcclient, values[i]), request_id=f"r{i}",
                                 **seq_kwargs(cid, i, len(values)))
            result, error = q.get(timeout=TIMEOUT_S)
            assert error is None, error
            c.stop_stream()
            return value_of(result)
        finally:
            c.close()

    async def aio(i):
        c = grpcaio.InferenceServerClient(server.grpc_url)
        try:
            return value_of(await c.infer(model, make_inputs(grpcaio, values[i]), **seq_kwargs(cid, i, len(values))))
        finally:
            await c.close()

    h = httpclient.InferenceServerClient(server.http_url)
    try:
        got = [on_stream(0)]
        got.append(value_of(h.infer(model, make_inputs(httpclient, values[1]), **seq_kwargs(cid, 1, len(values)))))
        got.append(asyncio.run(aio(2)))
        got.append(on_stream(3))
    finally:
        h.close()
    assert got == exp
