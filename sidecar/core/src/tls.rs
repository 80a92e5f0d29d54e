//! TLS configurations: the server side for one intercepted host (its leaf certificate
//! chain and key, made by the `certs` package from the pod CA), HTTP/1.x only; and the
//! client side towards origins and parents, verified against the worker's trust file.

use std::sync::Arc;

use rustls::crypto::ring;
use rustls::{ClientConfig, RootCertStore, ServerConfig};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};

/// The application protocols a client may be told: the front end tunnels every client
/// that offers neither (its ClientHello is peeked first), so one of them is chosen
/// whenever ALPN is offered.
const ALPN: [&[u8]; 2] = [b"http/1.1", b"http/1.0"];

/// A server configuration from PEM: the chain (leaf first) and its private key.
pub fn server_config(chain_pem: &[u8], key_pem: &[u8]) -> Result<Arc<ServerConfig>, String> {
    let chain = CertificateDer::pem_slice_iter(chain_pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("the certificate chain: {e}"))?;
    if chain.is_empty() {
        return Err("the certificate chain holds no certificate".into());
    }
    let key = PrivateKeyDer::from_pem_slice(key_pem).map_err(|e| format!("the key: {e}"))?;
    let mut config = ServerConfig::builder_with_provider(Arc::new(ring::default_provider()))
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_no_client_auth()
        .with_single_cert(chain, key)
        .map_err(|e| e.to_string())?;
    config.alpn_protocols = ALPN.iter().map(|p| p.to_vec()).collect();
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
    let mut config = ClientConfig::builder_with_provider(Arc::new(ring::default_provider()))
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = alpn.to_vec();
    Ok(Arc::new(config))
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
