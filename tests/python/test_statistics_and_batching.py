"""Statistics extension, Prometheus metrics and the dynamic batcher as
tritonclient users see them."""

import concurrent.futures
import urllib.request

import numpy as np
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from helpers import simple_inputs


def test_statistics_count_inferences_http_and_grpc(server):
    http = httpclient.InferenceServerClient(server.http_url)
    grpc = grpcclient.InferenceServerClient(server.grpc_url)
    before = http.get_inference_statistics("simple_int8")["model_stats"][0]
    a = np.ones((2, 16), dtype=np.int8)
    inputs = [httpclient.InferInput("INPUT0", [2, 16], "INT8"), httpclient.InferInput("INPUT1", [2, 16], "INT8")]
    for i in inputs:
        i.set_data_from_numpy(a)
    for _ in range(3):
        http.infer("simple_int8", inputs)
    after = http.get_inference_statistics("simple_int8")["model_stats"][0]
    assert after["inference_count"] - before["inference_count"] == 6, "batch rows are counted"
    assert after["execution_count"] - before["execution_count"] == 3
    assert after["inference_stats"]["success"]["count"] - before["inference_stats"]["success"]["count"] == 3
    g = grpc.get_inference_statistics("simple_int8", as_json=True)["model_stats"][0]
    assert int(g["inference_count"]) == after["inference_count"]
    http.close()
    grpc.close()


def test_dynamic_batcher_merges_concurrent_requests(server):
    def one(i):
        c = httpclient.InferenceServerClient(server.http_url)
        try:
            inputs, a, b = simple_inputs(httpclient)
            r = c.infer("simple_dyna_batch", inputs)
            np.testing.assert_array_equal(r.as_numpy("OUTPUT0"), a + b)
            return int(r.as_numpy("BATCH_SIZE")[0][0])
        finally:
            c.close()

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        sizes = list(pool.map(one, range(16)))
    assert max(sizes) <= 8
    assert max(sizes) > 1, sizes


def test_prometheus_metrics_have_tritons_names(server):
    body = urllib.request.urlopen(f"http://{server.metrics_url}/metrics", timeout=5).read().decode()
    for name in (
        "nv_inference_request_success",
        "nv_inference_request_failure",
        "nv_inference_count",
        "nv_inference_exec_count",
        "nv_inference_request_duration_us",
        "nv_inference_queue_duration_us",
        "nv_inference_compute_input_duration_us",
        "nv_inference_compute_infer_duration_us",
        "nv_inference_compute_output_duration_us",
        "nv_inference_pending_request_count",
        "nv_cpu_utilization",
        "nv_cpu_memory_total_bytes",
        "nv_cpu_memory_used_bytes",
    ):
        assert f"\n{name}" in body or body.startswith(name) or f"# TYPE {name} " in body, name
    assert 'nv_inference_request_success{model="simple",version="1"}' in body
