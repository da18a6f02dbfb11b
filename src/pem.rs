//! PEM contents shared by every TLS client and server of the service (the
//! gRPC listener, the Redis connections): certificates and private keys,
//! with a reason a person can act on when a file holds neither.

use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};

/// Every certificate in `pem`; at least one.
pub(crate) fn certificates(pem: &[u8]) -> Result<Vec<CertificateDer<'static>>, String> {
    let certs = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("unreadable certificate: {e}"))?;
    if certs.is_empty() {
        return Err("no certificate (expected a PEM `BEGIN CERTIFICATE` block)".to_owned());
    }
    Ok(certs)
}

/// The private key in `pem`: PKCS#1 RSA, PKCS#8 or SEC1 EC.
pub(crate) fn private_key(pem: &[u8]) -> Result<PrivateKeyDer<'static>, String> {
    PrivateKeyDer::from_pem_slice(pem)
        .map_err(|e| format!("no PKCS#1, PKCS#8 or SEC1 private key: {e}"))
}
