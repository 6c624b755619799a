//! TLS for the generator's connections (rustls, ring provider), with
//! perf_analyzer's options: `--ssl-grpc-*` for gRPC, `--ssl-https-*` for
//! HTTPS (an `https://` target, or any HTTPS file option, turns it on).
//! Peers are verified against the given CA file, else the system bundle.

use std::{fmt, net::IpAddr, path::Path, sync::Arc};

use anyhow::{anyhow, Context};
use rustls::{
    client::{
        danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier},
        WebPkiServerVerifier,
    },
    crypto::{verify_tls12_signature, verify_tls13_signature, CryptoProvider},
    pki_types::{pem::PemObject, CertificateDer, PrivateKeyDer, ServerName, UnixTime},
    CertificateError, ClientConfig, DigitallySignedStruct, Error, RootCertStore, SignatureScheme,
};

/// Where Debian (and most distributions) keep the system's CA bundle.
const SYSTEM_CA_BUNDLE: &str = "/etc/ssl/certs/ca-certificates.crt";

/// What the command line asked of one target's TLS.
#[derive(Debug, Clone, Default)]
pub struct ClientTlsOptions<'a> {
    /// PEM CA certificates to trust (else the system bundle).
    pub ca_file: Option<&'a Path>,
    /// PEM client certificate chain and key, for mutual TLS.
    pub cert_chain_file: Option<&'a Path>,
    pub key_file: Option<&'a Path>,
    /// Check the server's certificate chain (`--ssl-https-verify-peer`).
    pub verify_peer: bool,
    /// Check that the certificate names the host (`--ssl-https-verify-host`).
    pub verify_host: bool,
    /// `h2` (gRPC) or `http/1.1`.
    pub alpn: &'static [u8],
}

/// A target's TLS client configuration and the name it is checked against.
#[derive(Clone)]
pub struct ClientTls {
    pub config: Arc<ClientConfig>,
    pub server_name: ServerName<'static>,
}

impl fmt::Debug for ClientTls {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ClientTls")
            .field("server_name", &self.server_name)
            .finish()
    }
}

impl PartialEq for ClientTls {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.config, &other.config) && self.server_name == other.server_name
    }
}

fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

fn read_pem(path: &Path, what: &str) -> anyhow::Result<Vec<u8>> {
    std::fs::read(path).with_context(|| format!("cannot read {what} {}", path.display()))
}

fn certificates(path: &Path, what: &str) -> anyhow::Result<Vec<CertificateDer<'static>>> {
    let pem = read_pem(path, what)?;
    let certs = CertificateDer::pem_slice_iter(&pem)
        .collect::<Result<Vec<_>, _>>()
        .with_context(|| format!("{what} {} is not valid PEM", path.display()))?;
    if certs.is_empty() {
        return Err(anyhow!("no certificate in {what} {}", path.display()));
    }
    Ok(certs)
}

/// The host part of `host:port` (brackets of an IPv6 literal removed) as
/// a TLS server name: an IP address, or a DNS name for SNI.
pub fn server_name(authority: &str) -> anyhow::Result<ServerName<'static>> {
    let host = match authority.rsplit_once(':') {
        Some((h, port)) if port.chars().all(|c| c.is_ascii_digit()) => h,
        _ => authority,
    };
    let host = host.trim_start_matches('[').trim_end_matches(']');
    if let Ok(ip) = host.parse::<IpAddr>() {
        return Ok(ServerName::IpAddress(ip.into()));
    }
    ServerName::try_from(host.to_string())
        .map_err(|e| anyhow!("'{host}' is not a valid TLS server name: {e}"))
}

impl ClientTls {
    pub fn new(authority: &str, opts: &ClientTlsOptions<'_>) -> anyhow::Result<Self> {
        let provider = provider();
        let builder = ClientConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .context("TLS protocol versions")?;
        let verifier: Arc<dyn ServerCertVerifier> = if opts.verify_peer {
            let mut roots = RootCertStore::empty();
            let (path, what) = match opts.ca_file {
                Some(p) => (p, "CA certificates file"),
                None => (Path::new(SYSTEM_CA_BUNDLE), "system CA bundle"),
            };
            let (added, _) = roots.add_parsable_certificates(certificates(path, what)?);
            if added == 0 {
                return Err(anyhow!("no usable CA certificate in {}", path.display()));
            }
            let webpki =
                WebPkiServerVerifier::builder_with_provider(Arc::new(roots), provider.clone())
                    .build()
                    .context("TLS server verifier")?;
            if opts.verify_host {
                webpki as Arc<dyn ServerCertVerifier>
            } else {
                Arc::new(AnyName(webpki))
            }
        } else {
            Arc::new(NoVerification(provider))
        };
        let builder = builder
            .dangerous()
            .with_custom_certificate_verifier(verifier);
        let mut config = match (opts.cert_chain_file, opts.key_file) {
            (Some(chain), Some(key)) => {
                let chain = certificates(chain, "client certificate file")?;
                let key = PrivateKeyDer::from_pem_slice(&read_pem(key, "private key file")?)
                    .with_context(|| format!("no PEM private key in {}", key.display()))?;
                builder
                    .with_client_auth_cert(chain, key)
                    .context("client certificate and key do not match")?
            }
            (None, None) => builder.with_no_client_auth(),
            _ => {
                return Err(anyhow!(
                    "a client certificate needs both its chain file and its private key file"
                ))
            }
        };
        config.alpn_protocols = vec![opts.alpn.to_vec()];
        Ok(Self {
            config: Arc::new(config),
            server_name: server_name(authority)?,
        })
    }
}

/// Verifies the chain but not the name (`--ssl-https-verify-host 0`).
#[derive(Debug)]
struct AnyName(Arc<WebPkiServerVerifier>);

impl ServerCertVerifier for AnyName {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, Error> {
        match self
            .0
            .verify_server_cert(end_entity, intermediates, server_name, ocsp_response, now)
        {
            Err(Error::InvalidCertificate(
                CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
            )) => Ok(ServerCertVerified::assertion()),
            other => other,
        }
    }
    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, Error> {
        self.0.verify_tls12_signature(message, cert, dss)
    }
    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, Error> {
        self.0.verify_tls13_signature(message, cert, dss)
    }
    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.supported_verify_schemes()
    }
}

/// Accepts any certificate (`--ssl-https-verify-peer 0`); the handshake's
/// signatures are still checked, so the session key is the peer's.
#[derive(Debug)]
struct NoVerification(Arc<CryptoProvider>);

impl ServerCertVerifier for NoVerification {
    fn verify_server_cert(
        &self,
        _: &CertificateDer<'_>,
        _: &[CertificateDer<'_>],
        _: &ServerName<'_>,
        _: &[u8],
        _: UnixTime,
    ) -> Result<ServerCertVerified, Error> {
        Ok(ServerCertVerified::assertion())
    }
    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, Error> {
        verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }
    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, Error> {
        verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }
    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}
