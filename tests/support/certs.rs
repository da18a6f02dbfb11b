//! Certificates and TLS clients for the TLS tests (`tests/it/tls.rs`,
//! `tests/it/xds.rs`, `tests/envoy/envoy_gateway/`): certificate authorities and
//! leaves made with rcgen (RSA keys by the `openssl` command, which ring
//! cannot generate), Envoy Gateway's certificate shapes, and rustls clients
//! made by hand so a test sees which certificate a server showed and how
//! many connections a channel opened.

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll};

use hyper_util::rt::TokioIo;
use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, IsCa, KeyPair, KeyUsagePurpose,
};
use rustls::client::WantsClientCert;
use rustls::client::WebPkiServerVerifier;
use rustls::{ClientConfig, ConfigBuilder, RootCertStore};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;
use tonic::transport::{Channel, Endpoint, Uri};

/// A certificate authority.
pub struct Ca {
    issuer: CertifiedIssuer<'static, KeyPair>,
}

/// A certificate and its key, as PEM, with the certificate's DER to compare
/// with what a server shows.
pub struct Leaf {
    pub cert_pem: String,
    pub key_pem: String,
    pub der: CertificateDer<'static>,
}

/// The key usages Envoy Gateway's certgen gives every leaf (and no extended
/// key usage, so a leaf serves as a server and as a client certificate).
const EG_KEY_USAGES: [KeyUsagePurpose; 4] = [
    KeyUsagePurpose::DigitalSignature,
    KeyUsagePurpose::DataEncipherment,
    KeyUsagePurpose::KeyEncipherment,
    KeyUsagePurpose::ContentCommitment,
];

impl Ca {
    /// A CA with an ECDSA P-256 key.
    pub fn new(name: &str) -> Self {
        Self::with_key(name, KeyPair::generate().unwrap())
    }

    /// A CA as Envoy Gateway makes it: RSA 2048, self-signed.
    pub fn rsa(name: &str) -> Self {
        let (_, key) = rsa_key();
        Self::with_key(name, key)
    }

    fn with_key(name: &str, key: KeyPair) -> Self {
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.distinguished_name.push(DnType::CommonName, name);
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let issuer = CertifiedIssuer::self_signed(params, key).unwrap();
        Self { issuer }
    }

    pub fn pem(&self) -> String {
        self.issuer.pem()
    }

    pub fn der(&self) -> CertificateDer<'static> {
        self.issuer.der().clone()
    }

    /// A certificate for `localhost` signed with `key`. Like Envoy Gateway's
    /// certificates, it has no extended key usage, so it serves as a
    /// server and as a client certificate.
    pub fn sign(&self, key: &KeyPair, key_pem: String) -> Leaf {
        self.sign_for("localhost", key, key_pem)
    }

    pub fn sign_for(&self, name: &str, key: &KeyPair, key_pem: String) -> Leaf {
        let params = CertificateParams::new(vec![name.to_string()]).unwrap();
        self.issue(params, "envoy", key, key_pem)
    }

    fn issue(
        &self,
        mut params: CertificateParams,
        common_name: &str,
        key: &KeyPair,
        key_pem: String,
    ) -> Leaf {
        params
            .distinguished_name
            .push(DnType::CommonName, common_name);
        let cert = params.signed_by(key, &self.issuer).unwrap();
        Leaf {
            cert_pem: cert.pem(),
            key_pem,
            der: cert.der().clone(),
        }
    }

    /// An ECDSA P-256 certificate with a PKCS#8 key.
    pub fn leaf(&self) -> Leaf {
        self.leaf_for("localhost")
    }

    /// An ECDSA P-256 certificate for `name` with a PKCS#8 key.
    pub fn leaf_for(&self, name: &str) -> Leaf {
        let key = KeyPair::generate().unwrap();
        let pem = key.serialize_pem();
        self.sign_for(name, &key, pem)
    }

    /// An ECDSA P-256 certificate with a SEC1 (`EC PRIVATE KEY`) key.
    pub fn sec1_leaf(&self) -> Leaf {
        let key = KeyPair::generate().unwrap();
        let sec1 = openssl(&["ec"], &key.serialize_pem());
        assert!(sec1.starts_with("-----BEGIN EC PRIVATE KEY-----"), "{sec1}");
        self.sign(&key, sec1)
    }

    /// An RSA 2048 certificate whose key file is PKCS#1 (`RSA PRIVATE
    /// KEY`, as Envoy Gateway writes it) or PKCS#8.
    pub fn rsa_leaf(&self, pkcs1: bool) -> Leaf {
        self.rsa_leaf_for("localhost", pkcs1)
    }

    pub fn rsa_leaf_for(&self, name: &str, pkcs1: bool) -> Leaf {
        let (rsa, key) = rsa_key();
        let pkcs8 = key.serialize_pem();
        self.sign_for(name, &key, if pkcs1 { rsa } else { pkcs8 })
    }

    /// A leaf as Envoy Gateway's certgen makes it: RSA 2048 with a PKCS#1
    /// key file, common name `common_name`, DNS names `names`, EG's key
    /// usages and no extended key usage.
    pub fn eg_leaf(&self, common_name: &str, names: &[&str]) -> Leaf {
        let (rsa, key) = rsa_key();
        let names = names.iter().map(|n| n.to_string()).collect::<Vec<_>>();
        let mut params = CertificateParams::new(names).unwrap();
        params.key_usages = EG_KEY_USAGES.to_vec();
        self.issue(params, common_name, &key, rsa)
    }
}

/// A fresh RSA 2048 key: its PKCS#1 PEM and the key pair rcgen signs with.
fn rsa_key() -> (String, KeyPair) {
    let rsa = openssl(&["genrsa", "-traditional", "2048"], "");
    assert!(rsa.starts_with("-----BEGIN RSA PRIVATE KEY-----"), "{rsa}");
    let pkcs8 = openssl(&["pkcs8", "-topk8", "-nocrypt"], &rsa);
    let key = KeyPair::from_pkcs8_pem_and_sign_algo(&pkcs8, &rcgen::PKCS_RSA_SHA256).unwrap();
    (rsa, key)
}

/// Runs `openssl` with `input` on stdin and returns its stdout.
pub fn openssl(args: &[&str], input: &str) -> String {
    let mut child = Command::new("openssl")
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("the openssl command (apt-get install openssl)");
    use std::io::Write as _;
    child
        .stdin
        .take()
        .unwrap()
        .write_all(input.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "openssl {args:?} failed");
    String::from_utf8(out.stdout).unwrap()
}

// ---------------------------------------------------------------- clients

fn ring() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

fn roots(ca: &Ca) -> RootCertStore {
    let mut roots = RootCertStore::empty();
    roots.add(ca.der()).unwrap();
    roots
}

/// A client trusting `ca`, showing `identity` if given, offering h2. It
/// checks that the server's certificate is for `localhost`.
pub fn client_config(ca: &Ca, identity: Option<&Leaf>) -> Arc<ClientConfig> {
    let builder = ClientConfig::builder_with_provider(ring())
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots(ca));
    finish(builder, identity)
}

/// A client as Envoy Gateway configures Envoy towards the rate-limit
/// service: the chain must lead to `ca`, but no name is checked (EG sets no
/// SNI and no SAN match), TLS 1.3 at most.
pub fn chain_only_client_config(ca: &Ca, identity: Option<&Leaf>) -> Arc<ClientConfig> {
    let verifier = WebPkiServerVerifier::builder_with_provider(Arc::new(roots(ca)), ring())
        .build()
        .unwrap();
    let builder = ClientConfig::builder_with_provider(ring())
        .with_safe_default_protocol_versions()
        .unwrap()
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(sluice::certs::ChainOnly::new(verifier)));
    finish(builder, identity)
}

/// Shows `identity` if given and offers h2.
fn finish(
    builder: ConfigBuilder<ClientConfig, WantsClientCert>,
    identity: Option<&Leaf>,
) -> Arc<ClientConfig> {
    let mut config = match identity {
        Some(leaf) => builder
            .with_client_auth_cert(
                vec![leaf.der.clone()],
                PrivateKeyDer::from_pem_slice(leaf.key_pem.as_bytes()).unwrap(),
            )
            .unwrap(),
        None => builder.with_no_client_auth(),
    };
    config.alpn_protocols = vec![b"h2".to_vec()];
    Arc::new(config)
}

/// A TLS connection to `addr`, which must show a certificate for localhost.
pub async fn handshake(
    addr: SocketAddr,
    config: Arc<ClientConfig>,
) -> io::Result<TlsStream<TcpStream>> {
    let tcp = TcpStream::connect(addr).await?;
    let name = ServerName::try_from("localhost").unwrap();
    tokio_rustls::TlsConnector::from(config)
        .connect(name, tcp)
        .await
}

/// Opens TLS connections for a tonic channel and counts them.
#[derive(Clone)]
struct Connector {
    addr: SocketAddr,
    config: Arc<ClientConfig>,
    opened: Arc<AtomicUsize>,
}

impl tonic::codegen::Service<Uri> for Connector {
    type Response = TokioIo<TlsStream<TcpStream>>;
    type Error = io::Error;
    type Future = Pin<Box<dyn Future<Output = io::Result<Self::Response>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, _: Uri) -> Self::Future {
        let (addr, config, opened) = (self.addr, self.config.clone(), self.opened.clone());
        Box::pin(async move {
            let tls = handshake(addr, config).await?;
            opened.fetch_add(1, Ordering::SeqCst);
            Ok(TokioIo::new(tls))
        })
    }
}

/// A gRPC channel over TLS, and how many connections it has opened.
pub async fn channel(
    addr: SocketAddr,
    config: Arc<ClientConfig>,
) -> Result<(Channel, Arc<AtomicUsize>), tonic::transport::Error> {
    let opened = Arc::new(AtomicUsize::new(0));
    let connector = Connector {
        addr,
        config,
        opened: opened.clone(),
    };
    // `http`: the connector brings its own TLS, which tonic must not add.
    let channel = Endpoint::from_static("http://localhost")
        .connect_with_connector(connector)
        .await?;
    Ok((channel, opened))
}
