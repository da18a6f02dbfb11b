//! How a connection to one Redis is made: TCP or a unix socket, TLS when
//! the URL says `rediss`, the login (`AUTH`, `SELECT`), and, for a Sentinel
//! service, which server is its primary now. Over the socket runs redis-rs's
//! multiplexed connection: many calls in flight at once, answered in order.
//!
//! The socket is made here rather than by redis-rs so that TLS is this
//! crate's own (an extra CA, client certificates, a host-name check that
//! can be skipped: `tls.rs`), and so that the task carrying a connection's
//! traffic is the caller's to watch: when it ends, the connection is gone
//! and `node.rs` makes a new one.

use std::sync::Arc;
use std::time::Duration;

use redis::aio::MultiplexedConnection;
use redis::{AsyncConnectionConfig, ErrorKind, RedisConnectionInfo, RedisError, Value};
use rustls_pki_types::ServerName;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpStream, UnixStream};
use tokio::task::JoinHandle;
use tokio_rustls::TlsConnector;

use super::url::{Address, Endpoint};

/// Where a node's connections go.
#[derive(Clone, Debug)]
pub(super) enum Place {
    /// This server.
    At(Address),
    /// Whatever server the sentinels name as the service's primary, asked
    /// again on every new connection (so a failover is followed).
    Primary {
        sentinels: Vec<Address>,
        service: String,
    },
}

/// Why no connection was made.
#[derive(Debug)]
pub(super) enum DialError {
    /// Redis refused the credentials (its words never hold the password).
    Refused(String),
    /// Anything else: not reachable, TLS, a replica named as primary.
    Failed(String),
}

/// A connection and the task that carries its traffic: the task ends when
/// the connection does (closed by Redis, broken, or aborted).
pub(super) type Connection = (MultiplexedConnection, JoinHandle<()>);

/// Makes connections with one set of credentials and TLS settings.
pub(super) struct Dialer {
    /// Credentials and database of the servers that hold counters.
    login: RedisConnectionInfo,
    /// The same credentials, database 0: sentinels have no databases.
    sentinel_login: RedisConnectionInfo,
    tls: Option<TlsConnector>,
    /// Bounds one whole attempt: connect, TLS, login.
    timeout: Duration,
}

impl Dialer {
    /// A dialer for `endpoint`'s credentials, over TLS with `tls` when set.
    pub(super) fn new(
        endpoint: &Endpoint,
        tls: Option<Arc<rustls::ClientConfig>>,
        timeout: Duration,
    ) -> Dialer {
        let mut login = RedisConnectionInfo::default().set_skip_set_lib_name();
        if let Some(user) = &endpoint.username {
            login = login.set_username(user);
        }
        if let Some(password) = &endpoint.password {
            login = login.set_password(password);
        }
        let sentinel_login = login.clone();
        Dialer {
            login: login.set_db(endpoint.database),
            sentinel_login,
            tls: tls.map(TlsConnector::from),
            timeout: timeout.max(Duration::from_millis(100)),
        }
    }

    /// A logged-in connection to `place`.
    pub(super) async fn connect(&self, place: &Place) -> Result<Connection, DialError> {
        let (sentinels, service) = match place {
            Place::At(address) => return self.dial(address, &self.login).await,
            Place::Primary { sentinels, service } => (sentinels, service),
        };
        let address = self.primary(sentinels, service).await?;
        let (mut conn, driver) = self.dial(&address, &self.login).await?;
        // A sentinel's answer may be stale for a moment around a failover:
        // counting on a replica would fail every call, so check.
        let role_cmd = redis::cmd("ROLE");
        let role = role_cmd.query_async::<Value>(&mut conn);
        let reply = match tokio::time::timeout(self.timeout, role).await {
            Ok(Ok(reply)) => reply,
            Ok(Err(e)) => {
                driver.abort();
                return Err(DialError::Failed(format!("ROLE at {address}: {e}")));
            }
            Err(_) => {
                driver.abort();
                return Err(DialError::Failed(format!("ROLE at {address} timed out")));
            }
        };
        let is_primary = matches!(&reply, Value::Array(parts)
            if matches!(parts.first(), Some(Value::BulkString(role)) if role == b"master"));
        if !is_primary {
            driver.abort();
            return Err(DialError::Failed(format!(
                "{address}, named primary of '{service}' by the sentinels, is not a primary"
            )));
        }
        Ok((conn, driver))
    }

    /// The primary of `service`, from the first sentinel that knows it.
    async fn primary(&self, sentinels: &[Address], service: &str) -> Result<Address, DialError> {
        let mut last = DialError::Failed("no sentinel given".into());
        for sentinel in sentinels {
            let (mut conn, driver) = match self.dial(sentinel, &self.sentinel_login).await {
                Ok(connection) => connection,
                Err(e) => {
                    last = e;
                    continue;
                }
            };
            let mut ask = redis::cmd("SENTINEL");
            ask.arg("get-master-addr-by-name").arg(service);
            let ask = ask.query_async::<Option<(String, u16)>>(&mut conn);
            let answer = tokio::time::timeout(self.timeout, ask).await;
            driver.abort();
            last = match answer {
                Ok(Ok(Some((host, port)))) => return Ok(Address::Tcp { host, port }),
                Ok(Ok(None)) => DialError::Failed(format!(
                    "the sentinel at {sentinel} knows no service '{service}'"
                )),
                Ok(Err(e)) => DialError::Failed(format!("the sentinel at {sentinel}: {e}")),
                Err(_) => DialError::Failed(format!("the sentinel at {sentinel} did not answer")),
            };
        }
        Err(last)
    }

    /// One attempt at `address`, bounded by the dialer's timeout.
    async fn dial(
        &self,
        address: &Address,
        login: &RedisConnectionInfo,
    ) -> Result<Connection, DialError> {
        let attempt = async {
            match address {
                Address::Tcp { host, port } => {
                    let tcp = TcpStream::connect((host.as_str(), *port))
                        .await
                        .map_err(|e| DialError::Failed(format!("{address}: {e}")))?;
                    // Small writes go out at once: each is a whole call.
                    let _ = tcp.set_nodelay(true);
                    match &self.tls {
                        None => start(tcp, login, address).await,
                        Some(tls) => {
                            let name = ServerName::try_from(host.clone()).map_err(|e| {
                                DialError::Failed(format!("{address}: not a TLS server name: {e}"))
                            })?;
                            let stream = tls
                                .connect(name, tcp)
                                .await
                                .map_err(|e| DialError::Failed(format!("TLS to {address}: {e}")))?;
                            start(stream, login, address).await
                        }
                    }
                }
                Address::Unix(path) => {
                    let socket = UnixStream::connect(path)
                        .await
                        .map_err(|e| DialError::Failed(format!("{address}: {e}")))?;
                    start(socket, login, address).await
                }
            }
        };
        tokio::time::timeout(self.timeout, attempt)
            .await
            .map_err(|_| {
                DialError::Failed(format!(
                    "{address}: no connection within {:?}",
                    self.timeout
                ))
            })?
    }
}

/// Logs in over `stream` and starts the task that carries its traffic.
async fn start<S>(
    stream: S,
    login: &RedisConnectionInfo,
    address: &Address,
) -> Result<Connection, DialError>
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    // No timeouts of redis-rs's own: the store bounds every call itself,
    // and a reply that comes late must still be read (to refund it).
    let config = AsyncConnectionConfig::new()
        .set_response_timeout(None)
        .set_connection_timeout(None);
    let (conn, driver) = MultiplexedConnection::new_with_config(login, stream, config)
        .await
        .map_err(|e| refusal(&e).unwrap_or_else(|| DialError::Failed(format!("{address}: {e}"))))?;
    Ok((conn, tokio::spawn(driver)))
}

/// Whether `e` is Redis refusing our credentials, and in what words.
pub(super) fn refusal(e: &RedisError) -> Option<DialError> {
    let refused = e.kind() == ErrorKind::AuthenticationFailed
        || matches!(e.code(), Some("NOAUTH" | "WRONGPASS"));
    refused.then(|| DialError::Refused(e.to_string()))
}
