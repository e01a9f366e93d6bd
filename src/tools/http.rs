//! The HTTP client every tool shares, with the system's root certificates loaded on the first
//! TLS handshake instead of when the client is built.
//!
//! reqwest's own rustls set-up verifies with `rustls-platform-verifier`, which on Linux reads
//! the certificate bundle *and* every file of `/etc/ssl/certs` when the client is built: ~300
//! files parsed, ~15 ms of start-up and a root store kept in memory, although a vault whose tools
//! only talk plain HTTP to 127.0.0.1 (a local SearXNG, an MCP server) never needs one. Here the
//! same verifier is built on the first `https://` handshake; verification itself is unchanged
//! (the platform verifier does it), and the TLS settings are reqwest's defaults.

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::{CryptoProvider, WebPkiSupportedAlgorithms};
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{DigitallySignedStruct, Error as TlsError, SignatureScheme};

/// Whether a URL's host (`localhost`, `127.0.0.1`, `[::1]`: brackets or not) is this machine:
/// the one place plain `http://` (no TLS) is allowed to carry a credential (docs/design.md §8.12).
pub fn is_loopback_host(host: &str) -> bool {
    let host = host
        .strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(host);
    match host.parse::<std::net::IpAddr>() {
        Ok(ip) => ip.is_loopback(),
        Err(_) => host.eq_ignore_ascii_case("localhost"),
    }
}

/// The client: one connection pool for every tool. Building it reads no certificate.
pub fn client() -> Result<reqwest::Client, reqwest::Error> {
    client_with(Arc::new(PlatformRoots::new(Vec::new())))
}

fn client_with(verifier: Arc<PlatformRoots>) -> Result<reqwest::Client, reqwest::Error> {
    let provider = verifier.provider.clone();
    // reqwest's defaults: every TLS version the provider has, SNI on, h2 then http/1.1.
    let mut tls = rustls::ClientConfig::builder_with_provider(provider)
        .with_protocol_versions(rustls::ALL_VERSIONS)
        .expect("the default provider supports TLS 1.2 and 1.3")
        .dangerous()
        .with_custom_certificate_verifier(verifier)
        .with_no_client_auth();
    tls.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    reqwest::Client::builder()
        .tls_backend_preconfigured(tls)
        .user_agent(concat!("vaultd/", env!("CARGO_PKG_VERSION")))
        .connect_timeout(Duration::from_secs(10))
        .pool_idle_timeout(Duration::from_secs(60))
        .build()
}

/// `rustls_platform_verifier::Verifier`, built when a server certificate first needs checking.
#[derive(Debug)]
struct PlatformRoots {
    provider: Arc<CryptoProvider>,
    /// Trusted beside the system's roots (tests only; empty in the daemon).
    extra_roots: Vec<CertificateDer<'static>>,
    verifier: OnceLock<Result<rustls_platform_verifier::Verifier, TlsError>>,
}

impl PlatformRoots {
    fn new(extra_roots: Vec<CertificateDer<'static>>) -> PlatformRoots {
        PlatformRoots {
            // As reqwest: a provider the program installed, else aws-lc-rs.
            provider: CryptoProvider::get_default()
                .cloned()
                .unwrap_or_else(|| Arc::new(rustls::crypto::aws_lc_rs::default_provider())),
            extra_roots,
            verifier: OnceLock::new(),
        }
    }

    /// Whether the system's roots have been read.
    #[cfg(test)]
    fn loaded(&self) -> bool {
        self.verifier.get().is_some()
    }

    fn algorithms(&self) -> &WebPkiSupportedAlgorithms {
        &self.provider.signature_verification_algorithms
    }
}

impl ServerCertVerifier for PlatformRoots {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, TlsError> {
        self.verifier
            .get_or_init(|| {
                rustls_platform_verifier::Verifier::new_with_extra_roots(
                    self.extra_roots.iter().cloned(),
                    self.provider.clone(),
                )
            })
            .as_ref()
            .map_err(Clone::clone)?
            .verify_server_cert(end_entity, intermediates, server_name, ocsp_response, now)
    }

    // The handshake signatures are checked as the platform verifier checks them: by the
    // provider's algorithms, which need no root store.
    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, TlsError> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, self.algorithms())
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, TlsError> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, self.algorithms())
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.algorithms().supported_schemes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rustls::pki_types::PrivateKeyDer;
    use rustls::pki_types::pem::PemObject;
    use std::io::{Read, Write};

    const FIXTURES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/tls");

    fn pem(name: &str) -> Vec<u8> {
        std::fs::read(format!("{FIXTURES}/{name}")).expect("TLS fixture")
    }

    /// A TLS server on 127.0.0.1 (certificate from `tests/fixtures/tls`, signed by `ca.pem`)
    /// that answers each connection's request with `200 ok`; returns its port.
    fn tls_server() -> u16 {
        let certs = CertificateDer::pem_slice_iter(&pem("cert.pem"))
            .collect::<Result<Vec<_>, _>>()
            .expect("server certificate");
        let key = PrivateKeyDer::from_pem_slice(&pem("key.pem")).expect("server key");
        let config = Arc::new(
            rustls::ServerConfig::builder_with_provider(Arc::new(
                rustls::crypto::aws_lc_rs::default_provider(),
            ))
            .with_safe_default_protocol_versions()
            .expect("versions")
            .with_no_client_auth()
            .with_single_cert(certs, key)
            .expect("server config"),
        );
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let port = listener.local_addr().expect("addr").port();
        std::thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                let conn = rustls::ServerConnection::new(config.clone()).expect("connection");
                let mut tls = rustls::StreamOwned::new(conn, stream);
                let mut request = Vec::new();
                let mut buf = [0u8; 1024];
                while !request.windows(4).any(|w| w == b"\r\n\r\n") {
                    match tls.read(&mut buf) {
                        Ok(0) | Err(_) => break,
                        Ok(n) => request.extend_from_slice(&buf[..n]),
                    }
                }
                let _ = tls.write_all(
                    b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\nconnection: close\r\n\r\nok",
                );
                let _ = tls.flush();
            }
        });
        port
    }

    fn get(client: &reqwest::Client, port: u16) -> Result<String, String> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        runtime.block_on(async {
            let answer = client
                .get(format!("https://127.0.0.1:{port}/"))
                .send()
                .await
                .map_err(|e| format!("{:?}", anyhow::Error::from(e)))?;
            answer.text().await.map_err(|e| e.to_string())
        })
    }

    #[test]
    fn roots_are_read_at_the_first_handshake_and_a_trusted_chain_passes() {
        let ca = CertificateDer::from_pem_slice(&pem("ca.pem")).expect("CA");
        let roots = Arc::new(PlatformRoots::new(vec![ca]));
        let client = client_with(roots.clone()).expect("client");
        assert!(!roots.loaded(), "building the client read the roots");
        let port = tls_server();
        assert_eq!(get(&client, port).as_deref(), Ok("ok"));
        assert!(roots.loaded());
    }

    #[test]
    fn a_certificate_no_root_vouches_for_is_refused() {
        let roots = Arc::new(PlatformRoots::new(Vec::new()));
        let client = client_with(roots.clone()).expect("client");
        let port = tls_server();
        let err = get(&client, port).expect_err("an unknown issuer must be refused");
        assert!(err.contains("UnknownIssuer"), "{err}");
        assert!(roots.loaded());
    }
}

#[cfg(test)]
mod loopback_tests {
    #[test]
    fn loopback_hosts_bare_or_bracketed() {
        for host in [
            "localhost",
            "LOCALHOST",
            "127.0.0.1",
            "127.9.9.9",
            "::1",
            "[::1]",
        ] {
            assert!(super::is_loopback_host(host), "{host}");
        }
        for host in [
            "example.com",
            "10.0.0.1",
            "[::2]",
            "localhost.example.com",
            "",
        ] {
            assert!(!super::is_loopback_host(host), "{host}");
        }
    }
}
