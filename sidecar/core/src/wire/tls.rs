//! TLS configurations: the server side for one intercepted host (its leaf certificate
//! chain and key, made by the `certs` package from the pod CA), HTTP/1.x only; and the
//! client side towards origins and parents, verified against the worker's trust file.

use std::sync::Arc;

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use rustls::crypto::{CryptoProvider, ring};
use rustls::{CipherSuite, ClientConfig, RootCertStore, ServerConfig};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};

/// The application protocols a client may be told: the front end tunnels every client
/// that offers neither (its ClientHello is peeked first), so one of them is chosen
/// whenever ALPN is offered.
const ALPN: [&[u8]; 2] = [b"http/1.1", b"http/1.0"];

/// The ring provider with the AES-128-GCM suites first. They are as sound as the
/// AES-256 ones it lists first (TLS 1.3's mandatory suite among them) and cheaper: ten
/// rounds of AES instead of fourteen, and a key schedule on SHA-256, which the CPU's SHA
/// extensions compute, where SHA-384's is software (4% of a new connection's CPU went
/// to SHA-512 blocks).
fn provider() -> Arc<CryptoProvider> {
    let mut provider = ring::default_provider();
    provider
        .cipher_suites
        .sort_by_key(|suite| !is_aes_128_gcm(suite.suite()));
    Arc::new(provider)
}

fn is_aes_128_gcm(suite: CipherSuite) -> bool {
    matches!(
        suite,
        CipherSuite::TLS13_AES_128_GCM_SHA256
            | CipherSuite::TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256
            | CipherSuite::TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256
    )
}

/// A server configuration from PEM: the chain (leaf first) and its private key.
pub fn server_config(chain_pem: &[u8], key_pem: &[u8]) -> Result<Arc<ServerConfig>, String> {
    let chain = CertificateDer::pem_slice_iter(chain_pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("the certificate chain: {e}"))?;
    if chain.is_empty() {
        return Err("the certificate chain holds no certificate".into());
    }
    let key = PrivateKeyDer::from_pem_slice(key_pem).map_err(|e| format!("the key: {e}"))?;
    let mut config = ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_no_client_auth()
        .with_single_cert(chain, key)
        .map_err(|e| e.to_string())?;
    config.alpn_protocols = ALPN.iter().map(|p| p.to_vec()).collect();
    // Clients (OpenSSL's) list AES-256 first: the order above wins.
    config.ignore_client_order = true;
    Ok(Arc::new(config))
}

/// A client configuration: certificates are verified against the roots in `roots_pem`
/// (and only those), and `alpn` is offered.
pub fn client_config(roots_pem: &[u8], alpn: &[Vec<u8>]) -> Result<Arc<ClientConfig>, String> {
    let mut roots = RootCertStore::empty();
    // A system bundle may hold a certificate webpki cannot read (an old root with a
    // negative serial): it is left out, as OpenSSL's own loading would skip it too.
    let (added, _) =
        roots.add_parsable_certificates(CertificateDer::pem_slice_iter(roots_pem).flatten());
    if added == 0 {
        return Err("the trust file holds no usable certificate".into());
    }
    let mut config = ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = alpn.to_vec();
    Ok(Arc::new(config))
}

/// A client-side TLS configuration: the roots certificates are verified against.
#[pyclass(module = "sidecar.core.native", frozen)]
pub struct ClientTls {
    pub(crate) config: Arc<rustls::ClientConfig>,
}

#[pymethods]
impl ClientTls {
    #[new]
    #[pyo3(signature = (roots_pem, alpn=Vec::new()))]
    fn new(roots_pem: &[u8], alpn: Vec<Vec<u8>>) -> PyResult<Self> {
        let config = client_config(roots_pem, &alpn).map_err(PyValueError::new_err)?;
        Ok(Self { config })
    }
}

/// A server-side TLS configuration: the leaf chain and key for one intercepted host.
#[pyclass(module = "sidecar.core.native", frozen)]
pub struct TlsConfig {
    pub(crate) config: Arc<rustls::ServerConfig>,
}

#[pymethods]
impl TlsConfig {
    #[new]
    fn new(chain_pem: &[u8], key_pem: &[u8]) -> PyResult<Self> {
        let config = server_config(chain_pem, key_pem).map_err(PyValueError::new_err)?;
        Ok(Self { config })
    }
}

#[cfg(test)]
pub mod tests {
    use super::*;

    // Test fixtures only: an EC P-256 leaf for `localhost` and its chain (the leaf, then
    // the CA that signed it), its key, and that CA alone.
    pub const CHAIN: &[u8] = include_bytes!("testdata/localhost.crt");
    pub const KEY: &[u8] = include_bytes!("testdata/localhost.key");
    pub const CA: &[u8] = include_bytes!("testdata/ca.crt");

    #[test]
    fn a_chain_and_key_make_a_config_that_offers_http_1() {
        let config = server_config(CHAIN, KEY).unwrap();
        assert_eq!(config.alpn_protocols[0], b"http/1.1");
    }

    #[test]
    fn aes_128_gcm_comes_first_and_every_suite_stays() {
        let server = server_config(CHAIN, KEY).unwrap();
        let client = client_config(CA, &[]).unwrap();
        for suites in [
            &server.crypto_provider().cipher_suites,
            &client.crypto_provider().cipher_suites,
        ] {
            let names: Vec<CipherSuite> = suites.iter().map(|s| s.suite()).collect();
            assert_eq!(names[0], CipherSuite::TLS13_AES_128_GCM_SHA256);
            assert!(names[..3].iter().all(|&s| is_aes_128_gcm(s)), "{names:?}");
            assert_eq!(names.len(), ring::default_provider().cipher_suites.len());
        }
        assert!(server.ignore_client_order);
    }

    #[test]
    fn a_trust_file_without_certificates_is_refused() {
        let error = client_config(b"no certificates here", &[]).unwrap_err();
        assert!(error.contains("no usable certificate"), "{error}");
        let config = client_config(CA, &[b"http/1.1".to_vec()]).unwrap();
        assert_eq!(config.alpn_protocols, [b"http/1.1"]);
    }

    #[test]
    fn a_chain_without_certificates_is_refused() {
        let error = server_config(b"", KEY).unwrap_err();
        assert!(error.contains("no certificate"), "{error}");
        assert!(server_config(CHAIN, b"not a key").is_err());
    }
}
