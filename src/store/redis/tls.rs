//! TLS to Redis beyond a plain `rediss://` URL (which trusts the system
//! roots): an extra CA file, a client certificate for a Redis that requires
//! one (`tls-auth-clients yes`), and accepting a certificate whose name is
//! not the host's (envoyproxy/ratelimit's
//! `REDIS_TLS_SKIP_HOSTNAME_VERIFICATION`: the chain is still verified, so
//! only certificates from a trusted CA pass).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::client::WebPkiServerVerifier;
use rustls::{ClientConfig, RootCertStore};

use crate::certs::ChainOnly;

/// The TLS material of the Redis connections, as PEM files.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RedisTls {
    /// A CA Redis's certificate may chain to, besides the system roots.
    pub ca: Option<PathBuf>,
    /// The client certificate and its key (PKCS#1, PKCS#8 or SEC1).
    pub client: Option<(PathBuf, PathBuf)>,
    /// Accept a certificate whose names do not include the host dialled.
    pub skip_hostname_verification: bool,
}

impl RedisTls {
    /// Whether anything differs from a plain `rediss://` connection.
    pub fn is_default(&self) -> bool {
        *self == Self::default()
    }

    /// The client configuration for these files: roots (system and CA
    /// file), client certificate, and the host-name policy. The default
    /// (no files) is a plain `rediss://`: the system roots.
    pub(super) fn client_config(&self) -> Result<Arc<ClientConfig>, String> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut roots = RootCertStore::empty();
        // The system roots; a store with unreadable entries still has the
        // others (and the CA file may be all that is needed).
        roots.add_parsable_certificates(rustls_native_certs::load_native_certs().certs);
        if let Some(path) = &self.ca {
            for cert in crate::certs::certificates(&read(path)?).map_err(|e| at(path, e))? {
                roots.add(cert).map_err(|e| at(path, e.to_string()))?;
            }
        }
        let builder = ClientConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .map_err(|e| e.to_string())?;
        let verifier = WebPkiServerVerifier::builder_with_provider(Arc::new(roots), provider)
            .build()
            .map_err(|e| format!("the Redis TLS roots: {e}"))?;
        let builder = if self.skip_hostname_verification {
            builder
                .dangerous()
                .with_custom_certificate_verifier(Arc::new(ChainOnly::new(verifier)))
        } else {
            builder.with_webpki_verifier(verifier)
        };
        let config = match &self.client {
            Some((cert, key)) => {
                let chain = crate::certs::certificates(&read(cert)?).map_err(|e| at(cert, e))?;
                let key_der = crate::certs::private_key(&read(key)?).map_err(|e| at(key, e))?;
                builder
                    .with_client_auth_cert(chain, key_der)
                    .map_err(|e| format!("{} and {}: {e}", cert.display(), key.display()))?
            }
            None => builder.with_no_client_auth(),
        };
        Ok(Arc::new(config))
    }
}

fn read(path: &Path) -> Result<Vec<u8>, String> {
    std::fs::read(path).map_err(|e| at(path, e.to_string()))
}

fn at(path: &Path, what: impl std::fmt::Display) -> String {
    format!("Redis TLS file {}: {what}", path.display())
}
