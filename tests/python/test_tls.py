"""TLS with the real clients: tritonclient.grpc (`ssl=True` and its
certificate options) against `--grpc-use-ssl[-mutual]`, tritonclient.http
(`ssl=True`, `ssl_options`, `insecure`) against `--http-use-ssl[-mutual]`.
Certificates are made at run time with the `openssl` command."""

import shutil
import ssl
import subprocess
import urllib.request

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from helpers import simple_inputs
from serverproc import BINARY, ROOT, ServerProcess, free_port


def openssl(*args, cwd):
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


def make_ca(d, name):
    openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
            "-nodes", "-keyout", f"{name}.key", "-out", f"{name}.crt", "-days", "2",
            "-subj", f"/CN={name}",
            "-addext", "basicConstraints=critical,CA:TRUE",
            "-addext", "keyUsage=critical,keyCertSign,cRLSign", cwd=d)


def make_leaf(d, name, ca, usage, san=None):
    openssl("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
            "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", f"/CN={name}", cwd=d)
    ext = ["basicConstraints=CA:FALSE", "keyUsage=critical,digitalSignature",
           f"extendedKeyUsage={usage}"]
    if san:
        ext.append(f"subjectAltName={san}")
    (d / f"{name}.ext").write_text("\n".join(ext) + "\n")
    openssl("x509", "-req", "-in", f"{name}.csr", "-CA", f"{ca}.crt", "-CAkey", f"{ca}.key",
            "-CAcreateserial", "-out", f"{name}.crt", "-days", "2", "-extfile", f"{name}.ext",
            cwd=d)


@pytest.fixture(scope="module")
def certs(tmp_path_factory):
    if shutil.which("openssl") is None:
        pytest.fail("the openssl command is missing: run scripts/setup.sh")
    d = tmp_path_factory.mktemp("tls")
    make_ca(d, "ca")
    make_ca(d, "other-ca")
    make_leaf(d, "server", "ca", "serverAuth", "DNS:localhost,IP:127.0.0.1")
    make_leaf(d, "client", "ca", "clientAuth")
    make_leaf(d, "stranger", "other-ca", "clientAuth")
    return {k: str(d / k) for k in [
        "ca.crt", "server.crt", "server.key", "client.crt", "client.key",
        "stranger.crt", "stranger.key"]}


def https_context(certs, client=True):
    ctx = ssl.create_default_context(cafile=certs["ca.crt"])
    if client:
        ctx.load_cert_chain(certs["client.crt"], certs["client.key"])
    return ctx


def tls_args(certs, proto, mutual):
    args = [f"--{proto}-use-ssl-mutual=true" if mutual else f"--{proto}-use-ssl=true",
            f"--{proto}-server-cert", certs["server.crt"],
            f"--{proto}-server-key", certs["server.key"]]
    if mutual:
        args += [f"--{proto}-root-cert", certs["ca.crt"]]
    return args


@pytest.fixture(scope="module")
def tls_server(certs):
    """gRPC over TLS and HTTPS, no client certificates."""
    proc = ServerProcess([ROOT / "models"],
                         tls_args(certs, "grpc", False) + tls_args(certs, "http", False),
                         log="python-tls-server.log", cores=1,
                         https_context=https_context(certs, client=False))
    yield proc
    proc.stop_expecting_success()


@pytest.fixture(scope="module")
def mutual_server(certs):
    """gRPC and HTTPS with client certificates signed by ca.crt required."""
    proc = ServerProcess([ROOT / "models"],
                         tls_args(certs, "grpc", True) + tls_args(certs, "http", True),
                         log="python-mtls-server.log", cores=1,
                         https_context=https_context(certs, client=True))
    yield proc
    proc.stop_expecting_success()


def grpc_infer_ok(url, **tls):
    with grpcclient.InferenceServerClient(url, **tls) as c:
        assert c.is_server_live(client_timeout=20)
        inputs, a, b = simple_inputs(grpcclient)
        result = c.infer("simple", inputs, client_timeout=20)
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)
        np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - b)


def http_infer_ok(url, **tls):
    with httpclient.InferenceServerClient(url, **tls) as c:
        assert c.is_server_live()
        inputs, a, b = simple_inputs(httpclient)
        result = c.infer("simple", inputs)
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)
        np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - b)


def grpc_refused(url, **tls):
    with grpcclient.InferenceServerClient(url, **tls) as c:
        with pytest.raises(InferenceServerException) as e:
            c.is_server_live(client_timeout=20)
    assert e.value.status() == "StatusCode.UNAVAILABLE", e.value


def test_grpc_tls(tls_server, certs):
    grpc_infer_ok(tls_server.grpc_url, ssl=True, root_certificates=certs["ca.crt"])
    # A plaintext client fails cleanly; the server goes on serving TLS.
    grpc_refused(tls_server.grpc_url)
    grpc_infer_ok(tls_server.grpc_url, ssl=True, root_certificates=certs["ca.crt"])


def test_grpc_tls_untrusted_server_is_refused_by_the_client(tls_server, certs):
    # The client trusts another CA: its own verification fails.
    grpc_refused(tls_server.grpc_url, ssl=True, root_certificates=certs["stranger.crt"])
    grpc_infer_ok(tls_server.grpc_url, ssl=True, root_certificates=certs["ca.crt"])


def test_https(tls_server, certs):
    http_infer_ok(tls_server.http_url, ssl=True, ssl_options={"ca_certs": certs["ca.crt"]})
    # `insecure`: no host name check, the chain is still verified.
    http_infer_ok(tls_server.http_url, ssl=True, insecure=True,
                  ssl_options={"ca_certs": certs["ca.crt"]})
    # A plaintext client gets no answer; the server keeps serving.
    with httpclient.InferenceServerClient(tls_server.http_url, network_timeout=20) as c:
        with pytest.raises(Exception):
            c.is_server_live()
    http_infer_ok(tls_server.http_url, ssl=True, ssl_options={"ca_certs": certs["ca.crt"]})


def test_metrics_port_stays_plaintext(tls_server):
    with urllib.request.urlopen(f"http://{tls_server.metrics_url}/metrics", timeout=20) as r:
        assert r.status == 200
        assert b"nv_inference_request_success" in r.read()


def test_grpc_mutual_tls(mutual_server, certs):
    trusted = dict(ssl=True, root_certificates=certs["ca.crt"])
    grpc_infer_ok(mutual_server.grpc_url, private_key=certs["client.key"],
                  certificate_chain=certs["client.crt"], **trusted)
    # No client certificate, then one signed by another CA: refused.
    grpc_refused(mutual_server.grpc_url, **trusted)
    grpc_refused(mutual_server.grpc_url, private_key=certs["stranger.key"],
                 certificate_chain=certs["stranger.crt"], **trusted)
    grpc_infer_ok(mutual_server.grpc_url, private_key=certs["client.key"],
                  certificate_chain=certs["client.crt"], **trusted)


def test_https_mutual_tls(mutual_server, certs):
    ok = {"ca_certs": certs["ca.crt"], "certfile": certs["client.crt"],
          "keyfile": certs["client.key"]}
    http_infer_ok(mutual_server.http_url, ssl=True, ssl_options=ok)
    for refused in [{"ca_certs": certs["ca.crt"]},
                    {"ca_certs": certs["ca.crt"], "certfile": certs["stranger.crt"],
                     "keyfile": certs["stranger.key"]}]:
        with httpclient.InferenceServerClient(mutual_server.http_url, ssl=True,
                                              ssl_options=refused, network_timeout=20) as c:
            with pytest.raises(Exception):
                c.is_server_live()
    http_infer_ok(mutual_server.http_url, ssl=True, ssl_options=ok)


@pytest.mark.parametrize("args, expected", [
    (["--grpc-use-ssl=true", "--grpc-server-cert", "/nonexistent/server.crt",
      "--grpc-server-key", "/nonexistent/server.key"],
     "--grpc-server-cert: cannot read /nonexistent/server.crt"),
    (["--http-use-ssl-mutual=true", "--http-server-cert", "{crt}",
      "--http-server-key", "{key}"],
     "--http-use-ssl-mutual needs --http-root-cert"),
    (["--grpc-use-ssl=true"], "--grpc-use-ssl needs --grpc-server-cert and --grpc-server-key"),
    (["--grpc-use-ssl=true", "--grpc-server-cert", "{key}",
      "--grpc-server-key", "{key}"], "--grpc-server-cert: no certificate in"),
])
def test_bad_tls_settings_stop_the_start(certs, args, expected):
    args = [a.format(crt=certs["server.crt"], key=certs["server.key"])
            for a in args]
    r = subprocess.run([str(BINARY), "--model-repository", str(ROOT / "models"),
                        "--host", "127.0.0.1", "--http-port", str(free_port()),
                        "--grpc-port", str(free_port()), "--metrics-port", str(free_port()),
                        "--cores", "1", *args],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode != 0
    out = r.stdout + r.stderr
    assert expected in out, out
    assert "panicked" not in out, out
