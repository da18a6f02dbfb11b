//! Certificate handling shared by every TLS client and server of the
//! service (the gRPC listener, the Redis connections): PEM certificates and
//! private keys, with a reason a person can act on when a file holds
//! neither, and the verifier that checks a chain but not a name.

use std::sync::Arc;

use rustls::client::WebPkiServerVerifier;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::pki_types::{ServerName, UnixTime};
use rustls::{CertificateError, DigitallySignedStruct};
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

/// WebPKI verification with the name check left out: the chain, validity
/// and signatures are verified as usual, so only a certificate from a
/// trusted CA passes, whatever names it carries. For peers reached by an
/// address their certificate does not name (a Redis dialled by IP; Envoy
/// Gateway's Envoys, which set no SNI and match no SAN).
#[derive(Debug)]
pub struct ChainOnly(Arc<WebPkiServerVerifier>);

impl ChainOnly {
    /// Wraps a WebPKI verifier (its roots are the ones trusted).
    pub fn new(webpki: Arc<WebPkiServerVerifier>) -> Self {
        Self(webpki)
    }
}

impl ServerCertVerifier for ChainOnly {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        // The chain is checked before the name, so a name error means the
        // chain passed.
        match self
            .0
            .verify_server_cert(end_entity, intermediates, server_name, ocsp_response, now)
        {
            Err(rustls::Error::InvalidCertificate(
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
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.0.supported_verify_schemes()
    }
}
