//! TLS on the gRPC and HTTP ports: shardserve-bench's TLS client drives
//! inferences over both (server TLS and mutual TLS), and a raw rustls
//! client checks what must be refused (no client certificate, one from
//! another CA, a plaintext client, a stalled handshake) without disturbing
//! the server. Certificates are made at run time with the `openssl`
//! command.

mod common;

use std::{
    io::{Read, Write},
    net::{SocketAddr, TcpStream},
    path::{Path, PathBuf},
    process::Command,
    sync::Arc,
    time::{Duration, Instant},
};

use clap::Parser;
use rustls::{
    pki_types::{pem::PemObject, CertificateDer, PrivateKeyDer, ServerName},
    ClientConfig, ClientConnection, RootCertStore, StreamOwned,
};
use shardserve::{
    bench::{self, cli::Options, measure::StepResult},
    frontend::transport::TlsFiles,
    server::{ServerHandle, ServerOptions},
};

/// A CA, a server certificate for 127.0.0.1 and localhost, a client
/// certificate from the same CA and one from another CA, in a fresh folder.
struct Certs {
    dir: PathBuf,
}

fn openssl(dir: &Path, args: &[&str]) {
    let out = Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .output()
        .expect("the openssl command runs (scripts/setup.sh installs it)");
    assert!(
        out.status.success(),
        "openssl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

impl Certs {
    fn make(tag: &str) -> Self {
        let dir = std::env::temp_dir().join(format!("shardserve-tls-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("temp dir");
        for ca in ["ca", "other-ca"] {
            openssl(
                &dir,
                &[
                    "req",
                    "-x509",
                    "-newkey",
                    "ec",
                    "-pkeyopt",
                    "ec_paramgen_curve:prime256v1",
                    "-nodes",
                    "-keyout",
                    &format!("{ca}.key"),
                    "-out",
                    &format!("{ca}.crt"),
                    "-days",
                    "2",
                    "-subj",
                    &format!("/CN={ca}"),
                    "-addext",
                    "basicConstraints=critical,CA:TRUE",
                    "-addext",
                    "keyUsage=critical,keyCertSign,cRLSign",
                ],
            );
        }
        for (name, ca, usage, san) in [
            (
                "server",
                "ca",
                "serverAuth",
                Some("DNS:localhost,IP:127.0.0.1"),
            ),
            ("client", "ca", "clientAuth", None),
            ("stranger", "other-ca", "clientAuth", None),
        ] {
            openssl(
                &dir,
                &[
                    "req",
                    "-newkey",
                    "ec",
                    "-pkeyopt",
                    "ec_paramgen_curve:prime256v1",
                    "-nodes",
                    "-keyout",
                    &format!("{name}.key"),
                    "-out",
                    &format!("{name}.csr"),
                    "-subj",
                    &format!("/CN={name}"),
                ],
            );
            let mut ext = format!(
                "basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature\nextendedKeyUsage={usage}\n"
            );
            if let Some(san) = san {
                ext.push_str(&format!("subjectAltName={san}\n"));
            }
            std::fs::write(dir.join(format!("{name}.ext")), ext).expect("ext file");
            openssl(
                &dir,
                &[
                    "x509",
                    "-req",
                    "-in",
                    &format!("{name}.csr"),
                    "-CA",
                    &format!("{ca}.crt"),
                    "-CAkey",
                    &format!("{ca}.key"),
                    "-CAcreateserial",
                    "-out",
                    &format!("{name}.crt"),
                    "-days",
                    "2",
                    "-extfile",
                    &format!("{name}.ext"),
                ],
            );
        }
        Self { dir }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }

    fn arg(&self, name: &str) -> String {
        self.path(name).to_string_lossy().into_owned()
    }

    fn files(&self, mutual: bool) -> TlsFiles {
        TlsFiles {
            cert: self.path("server.crt"),
            key: self.path("server.key"),
            root: Some(self.path("ca.crt")),
            mutual,
        }
    }
}

impl Drop for Certs {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn start(certs: &Certs, mutual: bool, tweak: impl FnOnce(&mut ServerOptions)) -> ServerHandle {
    let mut opts = ServerOptions::for_tests(common::repo_path("models"));
    opts.grpc_tls = Some(certs.files(mutual));
    opts.http_tls = Some(certs.files(mutual));
    tweak(&mut opts);
    common::start_with(opts)
}

/// A blocking rustls client trusting `ca.crt`, presenting `client` (a
/// name in the folder: `client`, `stranger`) when given.
fn client_config(certs: &Certs, client: Option<&str>) -> Arc<ClientConfig> {
    let mut roots = RootCertStore::empty();
    for c in CertificateDer::pem_file_iter(certs.path("ca.crt")).expect("ca.crt") {
        roots.add(c.expect("CA certificate")).expect("CA added");
    }
    let builder =
        ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
            .with_safe_default_protocol_versions()
            .expect("versions")
            .with_root_certificates(roots);
    let mut config = match client {
        Some(name) => {
            let chain = CertificateDer::pem_file_iter(certs.path(&format!("{name}.crt")))
                .expect("chain")
                .collect::<Result<Vec<_>, _>>()
                .expect("chain parses");
            let key =
                PrivateKeyDer::from_pem_file(certs.path(&format!("{name}.key"))).expect("key");
            builder
                .with_client_auth_cert(chain, key)
                .expect("client auth")
        }
        None => builder.with_no_client_auth(),
    };
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Arc::new(config)
}

/// `GET path` over HTTPS with a fresh connection: the status, or the
/// error that ended the exchange.
fn https_get(addr: SocketAddr, config: Arc<ClientConfig>, path: &str) -> Result<u16, String> {
    let tcp = TcpStream::connect(addr).map_err(|e| e.to_string())?;
    tcp.set_read_timeout(Some(Duration::from_secs(20)))
        .expect("timeout");
    let name = ServerName::IpAddress(addr.ip().into());
    let conn = ClientConnection::new(config, name).map_err(|e| e.to_string())?;
    let mut tls = StreamOwned::new(conn, tcp);
    let request = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
    tls.write_all(request.as_bytes())
        .map_err(|e| e.to_string())?;
    let mut reply = Vec::new();
    tls.read_to_end(&mut reply).map_err(|e| e.to_string())?;
    let text = String::from_utf8_lossy(&reply);
    text.split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| format!("no HTTP status in {text:?}"))
}

/// Short windows, as in tests/bench_cli.rs.
fn bench_run(extra: &[&str]) -> Vec<StepResult> {
    let opts = Options::try_parse_from(common::bench_args(extra)).expect("arguments parse");
    bench::run(&opts).expect("bench runs").results
}

fn assert_served(results: &[StepResult]) {
    assert!(!results.is_empty());
    for r in results {
        assert!(r.requests > 0, "no successful request: {r:?}");
        assert_eq!(r.errors, 0, "errors: {:?}", r.first_error);
    }
}

/// The connection is closed by the server within `limit` (read gives end
/// of stream or an error), whatever it was sent.
fn closed_within(mut tcp: TcpStream, limit: Duration) -> Duration {
    let t0 = Instant::now();
    tcp.set_read_timeout(Some(limit)).expect("timeout");
    let mut buf = [0u8; 4096];
    loop {
        match tcp.read(&mut buf) {
            Ok(0) => return t0.elapsed(),
            Ok(_) => {}
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                panic!("connection still open after {limit:?}")
            }
            Err(_) => return t0.elapsed(),
        }
    }
}

#[test]
fn grpc_and_https_serve_inferences_over_tls() {
    let certs = Certs::make("server");
    let server = start(&certs, false, |_| {});
    let grpc = server.grpc_addr().to_string();
    let http = format!("https://{}", server.http_addr());
    let ca = certs.arg("ca.crt");
    assert_served(&bench_run(&[
        "-m",
        "simple",
        "-i",
        "grpc",
        "-u",
        &grpc,
        "--ssl-grpc-use-ssl",
        "--ssl-grpc-root-certifications-file",
        &ca,
        "--concurrency-range",
        "1,4",
    ]));
    assert_served(&bench_run(&[
        "-m",
        "simple",
        "-u",
        &http,
        "--ssl-https-ca-certificates-file",
        &ca,
        "--concurrency-range",
        "1,4",
    ]));
    // The metrics port stays plaintext.
    assert_eq!(common::get(server.metrics_addr(), "/metrics").status, 200);
    server.shutdown().expect("clean shutdown");
}

#[test]
fn mutual_tls_needs_a_client_certificate_from_the_root() {
    let certs = Certs::make("mutual");
    let server = start(&certs, true, |_| {});
    let addr = server.http_addr();
    let live = "/v2/health/live";
    assert_eq!(
        https_get(addr, client_config(&certs, Some("client")), live),
        Ok(200)
    );
    for refused in [None, Some("stranger")] {
        let r = https_get(addr, client_config(&certs, refused), live);
        assert!(r.is_err(), "{refused:?}: answered {r:?}");
    }
    assert_eq!(
        https_get(addr, client_config(&certs, Some("client")), live),
        Ok(200)
    );

    // gRPC, through the bench's client: with the certificate it works,
    // without it every request fails.
    let grpc = server.grpc_addr().to_string();
    let ca = certs.arg("ca.crt");
    let with_cert = [
        "--ssl-grpc-certificate-chain-file".to_string(),
        certs.arg("client.crt"),
        "--ssl-grpc-private-key-file".to_string(),
        certs.arg("client.key"),
    ];
    let mut args = vec![
        "-m",
        "simple",
        "-i",
        "grpc",
        "-u",
        &grpc,
        "--ssl-grpc-use-ssl",
        "--ssl-grpc-root-certifications-file",
        &ca,
    ];
    args.extend(with_cert.iter().map(String::as_str));
    assert_served(&bench_run(&args));
    let opts = Options::try_parse_from([
        "shardserve-bench",
        "-m",
        "simple",
        "-i",
        "grpc",
        "-u",
        &grpc,
        "--ssl-grpc-use-ssl",
        "--ssl-grpc-root-certifications-file",
        &ca,
        "-q",
        "--no-progress",
    ])
    .expect("arguments parse");
    assert!(
        bench::run(&opts).is_err(),
        "gRPC without a client certificate was served"
    );
    server.shutdown().expect("clean shutdown");
}

#[test]
fn plaintext_clients_and_stalled_handshakes_are_closed_and_the_server_keeps_serving() {
    let certs = Certs::make("plain");
    let server = start(&certs, false, |o| {
        o.http_header_timeout = Duration::from_secs(1);
        o.grpc_handshake_timeout = Duration::from_secs(1);
    });
    let trusted = client_config(&certs, None);
    let addr = server.http_addr();
    assert_eq!(
        https_get(addr, trusted.clone(), "/v2/health/ready"),
        Ok(200)
    );

    // A plaintext HTTP request on the HTTPS port: closed, no answer.
    let mut plain = TcpStream::connect(addr).expect("connect");
    plain
        .write_all(b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n\r\n")
        .expect("write");
    closed_within(plain, Duration::from_secs(20));
    // A plaintext HTTP/2 preface on the gRPC port: closed too.
    let mut plain = TcpStream::connect(server.grpc_addr()).expect("connect");
    plain
        .write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")
        .expect("write");
    closed_within(plain, Duration::from_secs(20));

    // Connections that never start their handshake are dropped after the
    // header (HTTP) and handshake (gRPC) timeouts, not kept forever.
    for port in [addr, server.grpc_addr()] {
        let idle = TcpStream::connect(port).expect("connect");
        let took = closed_within(idle, Duration::from_secs(20));
        assert!(
            took >= Duration::from_millis(500),
            "closed too early: {took:?}"
        );
    }
    assert_eq!(https_get(addr, trusted, "/v2/health/ready"), Ok(200));
    common::wait_for(
        "the refused connections to close",
        Duration::from_secs(20),
        || server.transport().open_connections() == 0,
    );
    server.shutdown().expect("clean shutdown");
}

#[test]
fn shutdown_is_not_held_by_a_connection_in_its_handshake() {
    let certs = Certs::make("drain");
    // Handshake timeouts far longer than the exit timeout.
    let server = start(&certs, false, |o| {
        o.http_header_timeout = Duration::from_secs(300);
        o.grpc_handshake_timeout = Duration::from_secs(300);
    });
    let stalled: Vec<TcpStream> = [server.http_addr(), server.grpc_addr()]
        .into_iter()
        .map(|a| TcpStream::connect(a).expect("connect"))
        .collect();
    common::wait_for(
        "the stalled connections to be accepted",
        Duration::from_secs(20),
        || server.transport().open_connections() == 2,
    );
    let t0 = Instant::now();
    server.shutdown().expect("clean shutdown");
    assert!(
        t0.elapsed() < Duration::from_secs(4),
        "shutdown took {:?}",
        t0.elapsed()
    );
    drop(stalled);
}

#[test]
fn unusable_certificates_stop_the_start_with_the_flag_and_path() {
    let certs = Certs::make("bad");
    let start = |tls: TlsFiles| {
        let mut opts = ServerOptions::for_tests(common::repo_path("models"));
        opts.grpc_tls = Some(tls);
        shardserve::server::start(opts)
            .map(drop)
            .map_err(|e| format!("{e:#}"))
    };
    let missing = start(TlsFiles {
        cert: "/nonexistent/server.crt".into(),
        ..certs.files(false)
    });
    let err = missing.expect_err("a missing certificate is refused");
    assert!(
        err.contains("--grpc-server-cert: cannot read /nonexistent/server.crt"),
        "{err}"
    );

    let swapped = start(TlsFiles {
        cert: certs.path("server.key"),
        ..certs.files(false)
    });
    let err = swapped.expect_err("a key as certificate is refused");
    assert!(
        err.contains("--grpc-server-cert: no certificate in"),
        "{err}"
    );

    let wrong_key = start(TlsFiles {
        key: certs.path("client.key"),
        ..certs.files(false)
    });
    let err = wrong_key.expect_err("a key of another certificate is refused");
    assert!(
        err.contains("do not make a usable certificate and key"),
        "{err}"
    );

    let no_root = start(TlsFiles {
        root: None,
        ..certs.files(true)
    });
    let err = no_root.expect_err("mutual TLS without a root is refused");
    assert!(
        err.contains("--grpc-use-ssl-mutual needs --grpc-root-cert"),
        "{err}"
    );
}

#[test]
fn bench_server_names_come_from_the_target_authority() {
    use shardserve::bench::tls::server_name;
    assert_eq!(
        server_name("127.0.0.1:8001").expect("IPv4"),
        ServerName::IpAddress(std::net::IpAddr::from([127, 0, 0, 1]).into())
    );
    assert_eq!(
        server_name("[::1]:8001").expect("IPv6"),
        ServerName::IpAddress(std::net::IpAddr::from(std::net::Ipv6Addr::LOCALHOST).into())
    );
    assert_eq!(
        server_name("localhost:8000").expect("DNS name"),
        ServerName::try_from("localhost").expect("DNS name")
    );
    assert!(server_name("bad name:1").is_err());
}

#[test]
fn bench_https_client_certificates_and_verification_switches() {
    let certs = Certs::make("bench");
    let server = start(&certs, true, |o| {
        o.host = std::net::IpAddr::from([0, 0, 0, 0])
    });
    let port = server.http_addr().port();
    let named = format!("https://127.0.0.1:{port}");
    // Loopback too, but not an address the certificate names.
    let unnamed = format!("https://127.0.0.2:{port}");
    let ca = certs.arg("ca.crt");
    let (crt, key) = (certs.arg("client.crt"), certs.arg("client.key"));
    let with = |url: &str, extra: &[&str]| {
        let mut v = vec![
            "-m".to_string(),
            "simple".to_string(),
            "-u".to_string(),
            url.to_string(),
            "--ssl-https-client-certificate-file".to_string(),
            crt.clone(),
            "--ssl-https-private-key-file".to_string(),
            key.clone(),
        ];
        v.extend(extra.iter().map(|s| s.to_string()));
        v
    };
    let run = |args: Vec<String>| {
        let refs: Vec<&str> = args.iter().map(String::as_str).collect();
        bench_run(&refs)
    };
    assert_served(&run(with(
        &named,
        &["--ssl-https-ca-certificates-file", &ca],
    )));

    let mut args = vec![
        "shardserve-bench".to_string(),
        "-q".into(),
        "--no-progress".into(),
    ];
    args.extend(with(&unnamed, &["--ssl-https-ca-certificates-file", &ca]));
    let opts = Options::try_parse_from(args).expect("arguments parse");
    let err = bench::run(&opts).expect_err("a certificate for another name is refused");
    assert!(
        format!("{err:#}").contains("TLS handshake failed"),
        "{err:#}"
    );

    assert_served(&run(with(
        &unnamed,
        &[
            "--ssl-https-ca-certificates-file",
            &ca,
            "--ssl-https-verify-host",
            "0",
        ],
    )));
    // No CA file and no check of the chain at all.
    assert_served(&run(with(&unnamed, &["--ssl-https-verify-peer", "0"])));
    server.shutdown().expect("clean shutdown");
}

#[test]
fn idle_tls_connections_close_after_the_idle_timeout() {
    let certs = Certs::make("idle");
    let server = start(&certs, false, |o| o.idle_timeout = Duration::from_secs(1));
    let addr = server.http_addr();
    let tcp = TcpStream::connect(addr).expect("connect");
    tcp.set_read_timeout(Some(Duration::from_secs(20)))
        .expect("timeout");
    let conn = ClientConnection::new(
        client_config(&certs, None),
        ServerName::IpAddress(addr.ip().into()),
    )
    .expect("client connection");
    let mut tls = StreamOwned::new(conn, tcp);
    while tls.conn.is_handshaking() {
        tls.conn.complete_io(&mut tls.sock).expect("handshake");
    }
    // Handshake done, no request: the keep-alive idle timeout closes it
    // (with a TLS close_notify), as it would a plaintext connection.
    let t0 = Instant::now();
    let mut buf = [0u8; 64];
    match tls.read(&mut buf) {
        Ok(0) => {}
        other => panic!("expected a clean close, got {other:?}"),
    }
    let took = t0.elapsed();
    assert!(
        took >= Duration::from_millis(500) && took < Duration::from_secs(15),
        "closed after {took:?}"
    );
    assert_eq!(
        https_get(addr, client_config(&certs, None), "/v2/health/live"),
        Ok(200)
    );
    server.shutdown().expect("clean shutdown");
}
