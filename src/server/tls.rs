//! TLS, and with a CA file mutual TLS, on the gRPC listener: loading the
//! certificate, key and CA from PEM files, and reloading them when they
//! change so that a rotated Kubernetes Secret takes effect without a
//! restart. New handshakes use the newest good configuration; connections
//! already established keep theirs. A file that fails to load leaves the
//! configuration in force and is logged and counted.
//!
//! Files are only read, never written: the process may run on a read-only
//! root as an unprivileged user.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use prometheus_client::metrics::counter::Counter;
use rustls::ServerConfig;
use rustls::server::WebPkiClientVerifier;
use rustls_pki_types::CertificateDer;
use tokio_rustls::TlsAcceptor;
use tokio_util::sync::CancellationToken;

/// The PEM files of the gRPC listener's TLS.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TlsFiles {
    /// The server's certificate chain, leaf first.
    pub cert: PathBuf,
    /// The certificate's private key: PKCS#1 RSA, PKCS#8, or SEC1 EC.
    pub key: PathBuf,
    /// When set, clients must present a certificate issued by one of these
    /// CAs (mutual TLS); clients without one are refused.
    pub ca: Option<PathBuf>,
}

/// How often the files are looked at for a change. Reading three small
/// files every few seconds is cheap, and unlike a file watcher it sees
/// Kubernetes' symlink swaps, replaced mounts and edits in place alike.
const RELOAD_INTERVAL: Duration = Duration::from_secs(2);

/// Why the TLS files could not be used.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// A file could not be read.
    #[error("TLS file {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// Why it could not be read.
        source: std::io::Error,
    },
    /// A file holds no usable PEM block of the kind expected.
    #[error("TLS file {path}: {what}")]
    Pem {
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        what: String,
    },
    /// rustls refused the certificate, key or CA.
    #[error("TLS files {cert} and {key}: {source}")]
    Config {
        /// The certificate file.
        cert: PathBuf,
        /// The key file.
        key: PathBuf,
        /// rustls's reason (a key that does not match the certificate…).
        source: rustls::Error,
    },
    /// The CA file's certificates cannot verify clients.
    #[error("TLS CA file {path}: {what}")]
    Ca {
        /// The CA file.
        path: PathBuf,
        /// What is wrong with it.
        what: String,
    },
}

/// The contents of the files, as last read.
#[derive(PartialEq, Eq)]
struct Contents {
    cert: Vec<u8>,
    key: Vec<u8>,
    ca: Option<Vec<u8>>,
}

impl Contents {
    fn read(files: &TlsFiles) -> Result<Self, TlsError> {
        let read = |path: &Path| {
            std::fs::read(path).map_err(|source| TlsError::Read {
                path: path.to_owned(),
                source,
            })
        };
        Ok(Self {
            cert: read(&files.cert)?,
            key: read(&files.key)?,
            ca: files.ca.as_deref().map(read).transpose()?,
        })
    }
}

/// Builds the server configuration: ring, TLS 1.2 and 1.3, ALPN `h2`, no
/// SNI needed (one certificate for every name), and with a CA, client
/// certificates required and verified against it.
fn server_config(files: &TlsFiles, contents: &Contents) -> Result<ServerConfig, TlsError> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let pem_error = |path: &Path, what: String| TlsError::Pem {
        path: path.to_owned(),
        what,
    };
    let certs = certificates(&files.cert, &contents.cert)?;
    let key =
        crate::certs::private_key(&contents.key).map_err(|what| pem_error(&files.key, what))?;
    let builder = ServerConfig::builder_with_provider(provider.clone())
        .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])
        .map_err(|source| TlsError::Config {
            cert: files.cert.clone(),
            key: files.key.clone(),
            source,
        })?;
    let builder = match (&files.ca, &contents.ca) {
        (Some(path), Some(ca)) => {
            let mut roots = rustls::RootCertStore::empty();
            for cert in certificates(path, ca)? {
                roots.add(cert).map_err(|e| TlsError::Ca {
                    path: path.clone(),
                    what: e.to_string(),
                })?;
            }
            let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
                .build()
                .map_err(|e| TlsError::Ca {
                    path: path.clone(),
                    what: e.to_string(),
                })?;
            builder.with_client_cert_verifier(verifier)
        }
        _ => builder.with_no_client_auth(),
    };
    let mut config = builder
        .with_single_cert(certs, key)
        .map_err(|source| TlsError::Config {
            cert: files.cert.clone(),
            key: files.key.clone(),
            source,
        })?;
    config.alpn_protocols = vec![b"h2".to_vec()];
    Ok(config)
}

/// Every certificate in a PEM file; at least one.
fn certificates(path: &Path, pem: &[u8]) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    crate::certs::certificates(pem).map_err(|what| TlsError::Pem {
        path: path.to_owned(),
        what,
    })
}

/// Counters of reloads that took effect and of reloads refused.
pub(crate) struct ReloadCounters {
    pub ok: Counter,
    pub error: Counter,
}

/// The TLS configuration in force, replaced when the files change.
pub(crate) struct Tls {
    current: ArcSwap<ServerConfig>,
}

impl Tls {
    /// Loads the files (an error names the file at fault) and, until
    /// `closing` is cancelled, reloads them when their contents change.
    pub(crate) fn start(
        files: TlsFiles,
        counters: ReloadCounters,
        closing: CancellationToken,
    ) -> Result<Arc<Self>, TlsError> {
        let contents = Contents::read(&files)?;
        let config = server_config(&files, &contents)?;
        tracing::info!(cert = %files.cert.display(), mutual = files.ca.is_some(), "gRPC listener serves TLS");
        let tls = Arc::new(Self {
            current: ArcSwap::from_pointee(config),
        });
        tokio::spawn(watch(tls.clone(), files, contents, counters, closing));
        Ok(tls)
    }

    /// An acceptor with the configuration in force now.
    pub(crate) fn acceptor(&self) -> TlsAcceptor {
        TlsAcceptor::from(self.current.load_full())
    }
}

/// Every `RELOAD_INTERVAL`, reads the files and, when they differ from
/// the files in force, builds a new configuration. A good one replaces the
/// one in force. A failure (unreadable or unusable files) changes nothing;
/// it is logged and counted once it is seen twice in a row, so that the
/// moment between replacing the key and replacing the certificate of a
/// pair is not reported, and once only while it lasts.
async fn watch(
    tls: Arc<Tls>,
    files: TlsFiles,
    mut in_force: Contents,
    counters: ReloadCounters,
    closing: CancellationToken,
) {
    let files = Arc::new(files);
    // The last failure seen, and the last one reported.
    let mut failed: Option<String> = None;
    let mut reported: Option<String> = None;
    loop {
        tokio::select! {
            () = closing.cancelled() => return,
            () = tokio::time::sleep(RELOAD_INTERVAL) => {}
        }
        let reading = files.clone();
        // Blocking file reads, off the serving threads.
        let Ok(read) = tokio::task::spawn_blocking(move || Contents::read(&reading)).await else {
            continue;
        };
        let loaded = read.and_then(|contents| {
            if contents == in_force {
                return Ok(None);
            }
            let config = server_config(&files, &contents)?;
            Ok(Some((config, contents)))
        });
        match loaded {
            Ok(None) => (failed, reported) = (None, None),
            Ok(Some((config, contents))) => {
                tls.current.store(Arc::new(config));
                in_force = contents;
                (failed, reported) = (None, None);
                counters.ok.inc();
                tracing::info!(cert = %files.cert.display(), "TLS certificate reloaded");
            }
            Err(error) => {
                let message = error.to_string();
                if failed.as_ref() == Some(&message) && reported.as_ref() != Some(&message) {
                    counters.error.inc();
                    tracing::error!(%error, "TLS files changed but do not load; keeping the configuration in force");
                    reported = Some(message.clone());
                }
                failed = Some(message);
            }
        }
    }
}
