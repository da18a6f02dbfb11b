//! TLS and mutual TLS for `sluice query`: the options, the client
//! configuration they describe (tonic's rustls transport, as the xDS
//! client's), and what a refusal means in the terms of those options. A
//! TLS 1.3 server refuses a client certificate after the handshake, with an
//! alert the HTTP/2 client drops; [`probe`] opens one connection by hand to
//! hear it.

use std::path::{Path, PathBuf};

use tonic::transport::{Certificate, ClientTlsConfig, Identity};

use super::QueryError;

/// TLS and mutual TLS to the server: on when any of these is given or the
/// address is `https://…`.
#[derive(Clone, Debug, Default, clap::Args)]
pub struct TlsArgs {
    /// Speak TLS and trust this CA (PEM) for the server's certificate,
    /// instead of the system's roots
    #[arg(long, value_name = "FILE")]
    pub tls_ca: Option<PathBuf>,
    /// Speak TLS and show this client certificate (PEM) for mutual TLS
    #[arg(long, value_name = "FILE", requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,
    /// The private key (PEM) of --tls-cert
    #[arg(long, value_name = "FILE", requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
    /// Speak TLS and check the server's certificate for this name instead
    /// of the address's host (for an address given as an IP)
    #[arg(long, value_name = "NAME")]
    pub tls_server_name: Option<String>,
}

impl TlsArgs {
    /// Whether any TLS option is given.
    pub(super) fn any(&self) -> bool {
        self.tls_ca.is_some()
            || self.tls_cert.is_some()
            || self.tls_key.is_some()
            || self.tls_server_name.is_some()
    }

    /// The client side of TLS these options describe; files are read and
    /// checked here, so a bad one is named before any connection.
    pub(super) fn config(&self) -> Result<ClientTlsConfig, QueryError> {
        let mut tls = ClientTlsConfig::new();
        tls = match &self.tls_ca {
            Some(ca) => {
                let pem = read(ca)?;
                crate::certs::certificates(&pem).map_err(|why| bad_file(ca, why))?;
                tls.ca_certificate(Certificate::from_pem(pem))
            }
            None => tls.with_native_roots(),
        };
        if let Some(name) = &self.tls_server_name {
            tls = tls.domain_name(name);
        }
        if let (Some(cert), Some(key)) = (&self.tls_cert, &self.tls_key) {
            let (cert_pem, key_pem) = (read(cert)?, read(key)?);
            crate::certs::certificates(&cert_pem).map_err(|why| bad_file(cert, why))?;
            crate::certs::private_key(&key_pem).map_err(|why| bad_file(key, why))?;
            tls = tls.identity(Identity::from_pem(cert_pem, key_pem));
        }
        Ok(tls)
    }
}

fn read(path: &Path) -> Result<Vec<u8>, QueryError> {
    std::fs::read(path).map_err(|e| bad_file(path, e.to_string()))
}

fn bad_file(path: &Path, why: String) -> QueryError {
    QueryError::TlsFile(path.display().to_string(), why)
}

/// The TLS error somewhere in `error`'s causes (rustls's own, which an
/// `io::Error` may wrap: its `source` skips the error it wraps).
fn tls_error<'a>(error: &'a (dyn std::error::Error + 'static)) -> Option<&'a rustls::Error> {
    let mut next = Some(error);
    while let Some(e) = next {
        if let Some(tls) = e.downcast_ref::<rustls::Error>() {
            return Some(tls);
        }
        if let Some(tls) = e
            .downcast_ref::<std::io::Error>()
            .and_then(|io| io.get_ref())
            .and_then(|inner| inner.downcast_ref::<rustls::Error>())
        {
            return Some(tls);
        }
        next = e.source();
    }
    None
}

/// What a TLS failure means, in the terms of `sluice query`'s options.
pub(super) fn tls_hint(error: &(dyn std::error::Error + 'static)) -> Option<String> {
    use rustls::{AlertDescription as Alert, CertificateError, Error};
    let hint = match tls_error(error)? {
        Error::InvalidCertificate(
            CertificateError::UnknownIssuer | CertificateError::BadSignature,
        ) => {
            "the server's certificate is not signed by the CA trusted (--tls-ca, or the system's roots)"
        }
        Error::InvalidCertificate(
            CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
        ) => {
            "the server's certificate does not name this host: give the name it carries with --tls-server-name"
        }
        Error::AlertReceived(Alert::CertificateRequired) => {
            "the server requires a client certificate (mutual TLS): give --tls-cert and --tls-key"
        }
        Error::AlertReceived(
            Alert::BadCertificate
            | Alert::UnknownCA
            | Alert::CertificateUnknown
            | Alert::DecryptError,
        ) => {
            "the server refused the client certificate (--tls-cert): it must be signed by a CA the server trusts"
        }
        Error::InvalidMessage(_) => "the server does not seem to speak TLS on this port",
        other => return Some(format!("TLS failed: {other}")),
    };
    Some(hint.to_owned())
}

/// Opens a TLS connection to `uri` as `tls` says, sends the HTTP/2 preface
/// and reads the server's first bytes: what its TLS refusal means, if it
/// refused (an alert after the handshake), or `None`.
pub(super) async fn probe(uri: &str, tls: &TlsArgs) -> Option<String> {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let uri: http::Uri = uri.parse().ok()?;
    let host = uri.host()?.trim_start_matches('[').trim_end_matches(']');
    let name = tls.tls_server_name.as_deref().unwrap_or(host).to_owned();
    let name = rustls_pki_types::ServerName::try_from(name).ok()?;
    let config = probe_config(tls).ok()?;
    let tcp = tokio::net::TcpStream::connect((host, uri.port_u16().unwrap_or(443)))
        .await
        .ok()?;
    let connector = tokio_rustls::TlsConnector::from(std::sync::Arc::new(config));
    let mut stream = match connector.connect(name, tcp).await {
        Ok(stream) => stream,
        Err(e) => return tls_hint(&e),
    };
    stream
        .write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")
        .await
        .ok()?;
    stream.flush().await.ok()?;
    let mut first = [0u8; 64];
    match stream.read(&mut first).await {
        Err(e) => tls_hint(&e),
        Ok(_) => None,
    }
}

/// The rustls client configuration equivalent to the one `tls` gives
/// tonic, for [`probe`].
fn probe_config(tls: &TlsArgs) -> Result<rustls::ClientConfig, QueryError> {
    let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
    let mut roots = rustls::RootCertStore::empty();
    match &tls.tls_ca {
        Some(ca) => {
            let certs = crate::certs::certificates(&read(ca)?).map_err(|why| bad_file(ca, why))?;
            roots.add_parsable_certificates(certs);
        }
        None => {
            roots.add_parsable_certificates(rustls_native_certs::load_native_certs().certs);
        }
    }
    let builder = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| QueryError::Tls(e.to_string()))?
        .with_root_certificates(roots);
    let mut config = match (&tls.tls_cert, &tls.tls_key) {
        (Some(cert), Some(key)) => {
            let certs =
                crate::certs::certificates(&read(cert)?).map_err(|why| bad_file(cert, why))?;
            let key = crate::certs::private_key(&read(key)?).map_err(|why| bad_file(key, why))?;
            builder
                .with_client_auth_cert(certs, key)
                .map_err(|e| QueryError::Tls(e.to_string()))?
        }
        _ => builder.with_no_client_auth(),
    };
    config.alpn_protocols = vec![b"h2".to_vec()];
    Ok(config)
}
