//! TLS on the gRPC and HTTP listeners (rustls with the `ring` provider;
//! no OpenSSL at build or run time).
//!
//! The certificates are read once at start-up into an `Arc<ServerConfig>`
//! that every shard shares read-only; a bad file stops the start with an
//! error naming the flag and the path. A connection's handshake runs on its
//! shard before hyper sees the stream, bounded by the protocol's handshake
//! (gRPC) or header (HTTP) timeout and cut short by the shard's drain; a
//! failed handshake (a plaintext client, an unknown CA, no client
//! certificate under mutual TLS) closes that connection only and is logged
//! at debug.
//!
//! The session cache is rustls's default (a small mutex-guarded map shared
//! by the shards): it is touched once per full handshake, never per
//! request.

use std::{
    os::fd::{AsRawFd, RawFd},
    path::{Path, PathBuf},
    sync::Arc,
    time::Duration,
};

use anyhow::{bail, Context};
use monoio::io::poll_io::{AsyncRead, AsyncWrite};
use rustls::{
    crypto::CryptoProvider,
    pki_types::{pem::PemObject, CertificateDer, PrivateKeyDer},
    server::WebPkiClientVerifier,
    RootCertStore, ServerConfig,
};
pub use tokio_rustls::{server::TlsStream, TlsAcceptor};

use super::ConnState;

/// The files and mode of one listener's TLS, as given on the command line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsFiles {
    /// PEM certificate chain presented to clients (leaf first).
    pub cert: PathBuf,
    /// PEM private key (PKCS#8, PKCS#1 or SEC1) of the leaf certificate.
    pub key: PathBuf,
    /// PEM CA certificates that client certificates must chain to; used
    /// only with `mutual`.
    pub root: Option<PathBuf>,
    /// Require a client certificate signed by `root` (mutual TLS).
    pub mutual: bool,
}

/// The loaded TLS configurations of the listeners that have one.
#[derive(Clone, Default)]
pub struct ServerTls {
    pub http: Option<TlsAcceptor>,
    pub grpc: Option<TlsAcceptor>,
}

impl std::fmt::Debug for ServerTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServerTls")
            .field("http", &self.http.is_some())
            .field("grpc", &self.grpc.is_some())
            .finish()
    }
}

impl ServerTls {
    /// Reads and checks the certificates of both listeners; errors name
    /// the flag (`--grpc-*`, `--http-*`) and the file.
    pub fn load(http: Option<&TlsFiles>, grpc: Option<&TlsFiles>) -> anyhow::Result<Self> {
        let acceptor = |files: Option<&TlsFiles>, flag: &str, alpn: &[u8]| {
            files
                .map(|f| server_config(f, flag, alpn).map(TlsAcceptor::from))
                .transpose()
        };
        Ok(Self {
            http: acceptor(http, "--http", b"http/1.1")?,
            grpc: acceptor(grpc, "--grpc", b"h2")?,
        })
    }
}

fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// The contents of `path`, given as `flag`; errors name both.
fn read(path: &Path, flag: &str) -> anyhow::Result<Vec<u8>> {
    std::fs::read(path).with_context(|| format!("{flag}: cannot read {}", path.display()))
}

/// Every certificate in the PEM file; none is an error.
pub fn read_certificates(path: &Path, flag: &str) -> anyhow::Result<Vec<CertificateDer<'static>>> {
    let pem = read(path, flag)?;
    let certs = CertificateDer::pem_slice_iter(&pem)
        .collect::<Result<Vec<_>, _>>()
        .with_context(|| format!("{flag}: {} is not valid PEM", path.display()))?;
    if certs.is_empty() {
        bail!("{flag}: no certificate in {}", path.display());
    }
    Ok(certs)
}

/// The first private key in the PEM file.
pub fn read_private_key(path: &Path, flag: &str) -> anyhow::Result<PrivateKeyDer<'static>> {
    let pem = read(path, flag)?;
    PrivateKeyDer::from_pem_slice(&pem)
        .with_context(|| format!("{flag}: no usable PEM private key in {}", path.display()))
}

/// A store of the CA certificates in the PEM file.
pub fn read_roots(path: &Path, flag: &str) -> anyhow::Result<RootCertStore> {
    let mut roots = RootCertStore::empty();
    for cert in read_certificates(path, flag)? {
        roots
            .add(cert)
            .with_context(|| format!("{flag}: unusable CA certificate in {}", path.display()))?;
    }
    Ok(roots)
}

fn server_config(files: &TlsFiles, flag: &str, alpn: &[u8]) -> anyhow::Result<Arc<ServerConfig>> {
    let cert_flag = format!("{flag}-server-cert");
    let key_flag = format!("{flag}-server-key");
    let root_flag = format!("{flag}-root-cert");
    let chain = read_certificates(&files.cert, &cert_flag)?;
    let key = read_private_key(&files.key, &key_flag)?;
    let provider = provider();
    let builder = ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .context("TLS protocol versions")?;
    let builder = if files.mutual {
        let Some(root) = &files.root else {
            bail!("{flag}-use-ssl-mutual needs {root_flag}: the CA that signs client certificates");
        };
        let roots = read_roots(root, &root_flag)?;
        let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
            .build()
            .with_context(|| format!("{root_flag}: {}", root.display()))?;
        builder.with_client_cert_verifier(verifier)
    } else {
        builder.with_no_client_auth()
    };
    let mut config = builder.with_single_cert(chain, key).with_context(|| {
        format!(
            "{cert_flag} {} and {key_flag} {} do not make a usable certificate and key",
            files.cert.display(),
            files.key.display()
        )
    })?;
    config.alpn_protocols = vec![alpn.to_vec()];
    tracing::info!(
        listener = flag.trim_start_matches("--"),
        mutual = files.mutual,
        cert = %files.cert.display(),
        "TLS on"
    );
    Ok(Arc::new(config))
}

/// Runs the server side of a TLS handshake on `io`, for at most `timeout`
/// and only while the shard is not draining. `None` when it failed, timed
/// out or was cut short; the caller then drops the connection.
pub async fn accept<T>(
    acceptor: &TlsAcceptor,
    io: T,
    state: &ConnState,
    timeout: Duration,
    what: &'static str,
) -> Option<TlsStream<T>>
where
    T: AsyncRead + AsyncWrite + Unpin,
{
    let handshake = monoio::time::timeout(timeout, acceptor.accept(io));
    let outcome = monoio::select! {
        r = handshake => Some(r),
        _ = state.drained() => None,
    };
    match outcome {
        Some(Ok(Ok(stream))) => Some(stream),
        Some(Ok(Err(e))) => {
            tracing::debug!(error = %e, "{what}: TLS handshake failed; connection closed");
            None
        }
        Some(Err(_)) => {
            tracing::debug!("{what}: TLS handshake not done within {timeout:?}; connection closed");
            None
        }
        None => None,
    }
}

/// The socket under a TLS stream (for the lingering close, which reads
/// and drops ciphertext just as well).
pub fn raw_fd<T: AsRawFd>(stream: &TlsStream<T>) -> RawFd {
    stream.get_ref().0.as_raw_fd()
}
