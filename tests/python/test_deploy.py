"""deploy/: the Kubernetes manifests validate against Kubernetes' own schemas
(kubernetes-validate, bundled OpenAPI schemas) and agree with each other;
the ServiceMonitor (a CRD kubernetes-validate has no schema for) is checked
field by field; KServe's ServingRuntime and InferenceService are checked
against the KServe SDK's generated models; and every
metric the Grafana dashboard and the HPA's prometheus-adapter rule query
exists on a running server."""

import json
import pathlib
import re
import shutil
import urllib.request

import numpy as np
import pytest
import tritonclient.http as httpclient
import yaml

import kserve_models
from serverproc import ROOT, ServerProcess

kubernetes_validate = pytest.importorskip(
    "kubernetes_validate", reason="scripts/setup.sh installs kubernetes-validate")

DEPLOY = ROOT / "deploy"
HEALTH_PATHS = {"/v2/health/live", "/v2/health/ready"}


def docs(path):
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def kube_docs():
    out = []
    for path in sorted((DEPLOY / "kubernetes").glob("*.yaml")):
        out += [(path.name, d) for d in docs(path)]
    return out


def validate(doc):
    kubernetes_validate.validate(doc, kubernetes_validate.latest_version(), strict=True)


def test_builtin_kinds_validate_against_the_kubernetes_schemas():
    checked = set()
    for name, doc in kube_docs():
        if doc["apiVersion"].startswith("monitoring.coreos.com"):
            continue
        validate(doc)
        checked.add(doc["kind"])
    assert {"Deployment", "Service", "HorizontalPodAutoscaler", "ConfigMap"} <= checked


def test_a_bad_manifest_is_refused():
    # The validator is strict: a misspelt field fails (so the test above
    # would catch one).
    _, deployment = next((n, d) for n, d in kube_docs() if d["kind"] == "Deployment")
    bad = json.loads(json.dumps(deployment))
    bad["spec"]["template"]["spec"]["containers"][0]["readinessProbes"] = {}
    with pytest.raises(kubernetes_validate.ValidationError):
        validate(bad)


def containers_of(doc):
    return doc["spec"]["template"]["spec"]["containers"]


def test_deployments_are_guaranteed_with_whole_cpus_and_health_probes():
    deployments = [d for _, d in kube_docs() if d["kind"] == "Deployment"]
    assert len(deployments) == 2
    gpu_seen = False
    for d in deployments:
        pod_labels = d["spec"]["template"]["metadata"]["labels"]
        assert d["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
        for c in containers_of(d):
            res = c["resources"]
            # Guaranteed QoS: requests equal limits for CPU and memory.
            assert res["requests"] == res["limits"], d["metadata"]["name"]
            cpu = str(res["limits"]["cpu"])
            assert re.fullmatch(r"[1-9][0-9]*", cpu), f"whole CPUs only, got {cpu}"
            gpu_seen |= "nvidia.com/gpu" in res["limits"]
            ports = {p["name"] for p in c["ports"]}
            for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
                get = c[probe]["httpGet"]
                assert get["path"] in HEALTH_PATHS, (probe, get)
                assert get["port"] in ports, (probe, get)
            assert c["livenessProbe"]["httpGet"]["path"] == "/v2/health/live"
            assert c["readinessProbe"]["httpGet"]["path"] == "/v2/health/ready"
            assert c["command"] == ["/opt/shardserve/bin/shardserve"]
    assert gpu_seen, "no GPU example"


def test_service_servicemonitor_and_hpa_point_at_what_exists():
    by_kind = {}
    for _, d in kube_docs():
        by_kind.setdefault(d["kind"], []).append(d)
    deployment = next(d for d in by_kind["Deployment"] if d["metadata"]["name"] == "shardserve")
    (service,) = by_kind["Service"]
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= pod_labels.items()
    container_ports = {p["name"] for p in containers_of(deployment)[0]["ports"]}
    service_ports = {p["name"] for p in service["spec"]["ports"]}
    assert {p["targetPort"] for p in service["spec"]["ports"]} <= container_ports

    # ServiceMonitor: no bundled schema; the fields monitoring.coreos.com/v1
    # defines for what is used here.
    (monitor,) = by_kind["ServiceMonitor"]
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    assert set(monitor["spec"]) <= {"selector", "endpoints", "namespaceSelector", "jobLabel"}
    assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    for ep in monitor["spec"]["endpoints"]:
        assert set(ep) <= {"port", "path", "interval", "scrapeTimeout", "scheme", "honorLabels"}
        assert ep["port"] in service_ports
        assert ep["path"] == "/metrics"

    (hpa,) = by_kind["HorizontalPodAutoscaler"]
    target = hpa["spec"]["scaleTargetRef"]
    assert (target["kind"], target["name"]) == ("Deployment", deployment["metadata"]["name"])
    (adapter,) = by_kind["ConfigMap"]
    rules = yaml.safe_load(adapter["data"]["config.yaml"])["rules"]
    served = {r["name"]["as"] for r in rules}
    for m in hpa["spec"]["metrics"]:
        assert m["pods"]["metric"]["name"] in served


# KServe: checked against the KServe SDK's generated models (PyPI `kserve`),
# run in a venv of their own (tests/python/kserve_models.py says why).
def kserve_errors(docs):
    try:
        return kserve_models.check(docs)
    except RuntimeError as e:
        pytest.fail(str(e))


def kserve_docs():
    (rt,) = docs(DEPLOY / "kserve" / "servingruntime.yaml")
    (isvc,) = docs(DEPLOY / "kserve" / "inferenceservice.yaml")
    return rt, isvc


def test_kserve_manifests_match_the_sdk_models():
    rt, isvc = kserve_docs()
    assert (rt["apiVersion"], rt["kind"]) == ("serving.kserve.io/v1alpha1", "ServingRuntime")
    assert (isvc["apiVersion"], isvc["kind"]) == ("serving.kserve.io/v1beta1", "InferenceService")
    assert kserve_errors([rt, isvc]) == [[], []]


def test_the_sdk_check_refuses_unknown_fields_and_wrong_types():
    rt, isvc = kserve_docs()
    misspelt = json.loads(json.dumps(rt))
    misspelt["spec"]["supportedModelFormat"] = misspelt["spec"].pop("supportedModelFormats")
    nested = json.loads(json.dumps(rt))
    # Deep inside: the kubernetes client's V1Probe in the runtime's container.
    nested["spec"]["containers"][0]["livenessProbe"]["httpGet"]["paht"] = "/v2/health/live"
    wrong_type = json.loads(json.dumps(isvc))
    wrong_type["spec"]["predictor"]["minReplicas"] = "one"
    not_a_list = json.loads(json.dumps(rt))
    not_a_list["spec"]["protocolVersions"] = "v2"
    errors = kserve_errors([misspelt, nested, wrong_type, not_a_list])
    assert len(errors[0]) == 1 and "spec.supportedModelFormat: no such field in " \
        "V1alpha1ServingRuntimeSpec" in errors[0][0], errors[0]
    assert len(errors[1]) == 1 and "livenessProbe.httpGet.paht: no such field in " \
        "V1HTTPGetAction" in errors[1][0], errors[1]
    assert errors[2] == ["InferenceService.spec.predictor.minReplicas: expected int, got str 'one'"]
    assert len(errors[3]) == 1 and "protocolVersions: expected a list" in errors[3][0], errors[3]


def test_kserve_serving_runtime():
    rt, _ = kserve_docs()
    spec = rt["spec"]
    # The SDK types protocolVersions as strings; KServe's API knows these.
    assert {"v2", "grpc-v2"} <= set(spec["protocolVersions"]) <= {"v1", "v2", "grpc-v1", "grpc-v2"}
    formats = {f["name"] for f in spec["supportedModelFormats"]}
    assert {"onnx", "triton"} <= formats
    # The containers are core/v1 Containers: also validated by Kubernetes'
    # schema inside a Pod (required fields, which the SDK check leaves out).
    (container,) = spec["containers"]
    assert container["name"] == "kserve-container"
    validate({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "x"},
              "spec": {"containers": spec["containers"]}})
    args = " ".join(container["args"])
    assert "--model-repository=/mnt/models" in args
    assert container["ports"][0]["containerPort"] == 8080 and "--http-port=8080" in args


def test_kserve_inference_service_uses_the_runtime():
    rt, isvc = kserve_docs()
    model = isvc["spec"]["predictor"]["model"]
    assert model["runtime"] == rt["metadata"]["name"]
    assert model["modelFormat"]["name"] in {f["name"] for f in rt["spec"]["supportedModelFormats"]}
    assert model["protocolVersion"] in rt["spec"]["protocolVersions"]


def metric_names(expr):
    # Metric names in PromQL; label values and functions are not nv_*.
    return set(re.findall(r"\b(nv_[a-z_]+)\b", expr))


def dashboard_metrics():
    dash = json.loads((DEPLOY / "grafana" / "shardserve-dashboard.json").read_text())
    names = set()
    for panel in dash["panels"]:
        assert panel["targets"], panel["title"]
        for t in panel["targets"]:
            found = metric_names(t["expr"])
            assert found, (panel["title"], t["expr"])
            names |= found
    for var in dash["templating"]["list"]:
        if var["type"] == "query":
            names |= metric_names(var["definition"])
    return names


def has_gpu():
    return any(pathlib.Path("/dev").glob("nvidia[0-9]*"))


def infer_and_scrape(server):
    # One inference (two with a cache: a miss, then a hit), so per-model
    # families have samples.
    c = httpclient.InferenceServerClient(server.http_url)
    inputs = [httpclient.InferInput("INPUT0", [1, 16], "INT32"),
              httpclient.InferInput("INPUT1", [1, 16], "INT32")]
    for i in inputs:
        i.set_data_from_numpy(np.ones((1, 16), dtype=np.int32))
    c.infer("simple", inputs)
    c.infer("simple", inputs)
    with urllib.request.urlopen(f"http://{server.metrics_url}/metrics", timeout=10) as r:
        text = r.read().decode()
    exposed = set(re.findall(r"^# TYPE (\S+) ", text, re.M))
    return exposed | set(re.findall(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)[{ ]", text, re.M))


def test_every_metric_queried_exists_on_a_running_server(server, tmp_path):
    exposed = infer_and_scrape(server)
    # The cache families exist only for models that enable the cache, on a
    # server that has one (as in Triton): scrape such a server too.
    repo = tmp_path / "repo"
    shutil.copytree(ROOT / "models" / "simple", repo / "simple")
    config = repo / "simple" / "config.pbtxt"
    config.write_text(config.read_text() + "\nresponse_cache { enable: true }\n")
    cached = ServerProcess([repo], ["--cache-config", "local,size=1048576"],
                           log="deploy-cache-server.log")
    try:
        exposed |= infer_and_scrape(cached)
    finally:
        cached.stop_expecting_success()

    adapter = next(d for _, d in kube_docs() if d["kind"] == "ConfigMap")
    wanted = dashboard_metrics() | metric_names(adapter["data"]["config.yaml"])
    missing = wanted - exposed
    if not has_gpu():
        # GPU families exist only where NVML finds a GPU (as in Triton): off a
        # GPU machine they must at least be names the server can export.
        source = "".join(p.read_text() for p in (ROOT / "src" / "metrics").glob("*.rs"))
        gpu = {m for m in missing if m.startswith("nv_gpu_")}
        assert all(f'"{m}"' in source for m in gpu), gpu
        missing -= gpu
    assert not missing, f"queried but not exported: {sorted(missing)}"
