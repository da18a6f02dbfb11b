//! One Redis to talk to: a single server, a Sentinel-managed service, or one
//! primary of a Cluster. A node holds a few fred clients of its own (each one
//! connection, pipelined), its circuit breaker, and the reason its last
//! connection attempt was refused, so that a wrong password is named.
//!
//! Every client is built so that fred never resends anything: one attempt per
//! command, fail-fast per command (nothing waits in fred's queue while the
//! connection is down), and a reconnect policy that keeps trying forever, so
//! a broken connection is replaced by fred. Should a client's connection task
//! end anyway, [`Node::renew`] builds a new client in its place. A command
//! only ever goes to a client that reports itself connected.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use fred::error::ErrorKind;
use fred::interfaces::{ClientLike, EventInterface, LuaInterface};
use fred::prelude::{Builder, Client, Config, Options, ReconnectPolicy};
use fred::types::scripts::Script;
use fred::types::{ClusterHash, ConnectHandle, CustomCommand, FromValue, Value};
use parking_lot::{Mutex, RwLock};

use crate::store::{Circuit, StoreError};

/// A node's name in messages and metrics: `host:port`, or the URL (without
/// its password) for a single server or a Sentinel service.
pub(super) type NodeName = Arc<str>;

/// How a script call ended, as the router needs to know it.
#[derive(Debug)]
pub(super) enum Sent {
    /// The script's reply.
    Reply(Vec<i64>),
    /// Redis answered without running the script: the call may go again.
    Redirect(Redirect),
    /// Anything else. The script may have run.
    Failed(StoreError),
}

/// A Cluster answer that means "not run here" (Redis checks the slot before
/// running anything).
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Redirect {
    /// The slot lives at this address for good.
    Moved { slot: u16, address: String },
    /// The slot is being migrated: ask this address, once, after `ASKING`.
    Ask { address: String },
    /// A multi-key call during a slot migration: try again shortly.
    TryAgain,
    /// The cluster cannot serve the slot now.
    Down(String),
}

impl Redirect {
    /// Reads a redirect from an error reply's text.
    pub(super) fn parse(details: &str) -> Option<Redirect> {
        let mut words = details.split_whitespace();
        match words.next()? {
            kind @ ("MOVED" | "ASK") => {
                let slot = words.next()?.parse().ok()?;
                let address = words.next()?.to_owned();
                Some(if kind == "MOVED" {
                    Redirect::Moved { slot, address }
                } else {
                    Redirect::Ask { address }
                })
            }
            "TRYAGAIN" => Some(Redirect::TryAgain),
            "CLUSTERDOWN" => Some(Redirect::Down(details.to_owned())),
            _ => None,
        }
    }
}

/// One client and the task that drives its connection.
struct Conn {
    client: Client,
    task: ConnectHandle,
}

/// One Redis target and its connections.
pub(super) struct Node {
    name: NodeName,
    /// Builds this node's clients, again when one must be replaced.
    builder: Builder,
    /// A lock per slot so that a dead client can be swapped for a new one
    /// while the others serve; reads only clone the client (an `Arc`).
    conns: Vec<RwLock<Conn>>,
    /// Round-robin position.
    next: AtomicUsize,
    /// This node's breaker: a dead node fails fast without failing others.
    pub(super) circuit: Circuit,
    /// Redis's words when it refused our credentials, until a connection
    /// succeeds again (written by the clients' event listeners).
    auth_refused: Arc<Mutex<Option<String>>>,
    created: Instant,
}

/// Options of every call: never queued while disconnected, never retried.
fn once() -> Options {
    Options {
        fail_fast: true,
        max_attempts: Some(1),
        ..Options::default()
    }
}

impl Node {
    /// A node over `config` with `size` connections, connecting in the
    /// background. `connect_timeout` bounds each connection attempt.
    pub(super) fn new(
        name: NodeName,
        mut config: Config,
        size: usize,
        connect_timeout: Duration,
    ) -> Result<Node, StoreError> {
        // Keep reconnecting even when Redis is not up at start; calls fail
        // fast on their own (see `once`).
        config.fail_fast = false;
        let mut builder = Builder::from_config(config);
        builder
            .with_connection_config(|c| {
                c.connection_timeout = connect_timeout.max(Duration::from_millis(100));
                // Never resend a script: it may already have counted.
                c.max_command_attempts = 1;
            })
            // Forever (0 attempts = no limit), from 0 up to 1 s apart.
            .set_policy(ReconnectPolicy::new_exponential(0, 50, 1_000, 2));
        let auth_refused = Arc::new(Mutex::new(None));
        let conns = (0..size.max(1))
            .map(|_| start(&builder, &auth_refused).map(RwLock::new))
            .collect::<Result<_, _>>()?;
        Ok(Node {
            name,
            builder,
            conns,
            next: AtomicUsize::new(0),
            circuit: Circuit::default(),
            auth_refused,
            created: Instant::now(),
        })
    }

    pub(super) fn name(&self) -> &NodeName {
        &self.name
    }

    /// Whether any connection is up.
    pub(super) fn is_connected(&self) -> bool {
        self.conns.iter().any(|c| c.read().client.is_connected())
    }

    /// Waits (at most `limit`) until a connection is up or Redis has refused
    /// our credentials.
    pub(super) async fn wait_connected(&self, limit: Duration) -> bool {
        let deadline = Instant::now() + limit;
        loop {
            if self.is_connected() {
                return true;
            }
            if self.auth_refused.lock().is_some() || Instant::now() >= deadline {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    /// A connected client, round-robin; none while every connection is
    /// down (the call then fails at once rather than queue).
    pub(super) fn client(&self) -> Result<Client, StoreError> {
        let start = self.next.fetch_add(1, Ordering::Relaxed);
        (0..self.conns.len())
            .map(|i| {
                self.conns[(start + i) % self.conns.len()]
                    .read()
                    .client
                    .clone()
            })
            .find(|c| c.is_connected())
            .ok_or_else(|| self.down())
    }

    /// Why this node cannot take a call now.
    pub(super) fn down(&self) -> StoreError {
        match self.auth_refused.lock().as_deref() {
            Some(why) => auth_failed(&self.name, why),
            None => StoreError::Unavailable(format!("Redis at {} is not connected", self.name)),
        }
    }

    /// A fred error as a store error, naming refused credentials.
    fn error(&self, e: &fred::error::Error) -> StoreError {
        if *e.kind() == ErrorKind::Auth {
            return auth_failed(&self.name, e.details());
        }
        if *e.kind() == ErrorKind::Canceled {
            // fred's answer to a call on a connection that just went down.
            return self.down();
        }
        StoreError::Unavailable(format!("Redis at {}: {e}", self.name))
    }

    /// Runs `script` once on this node (after `ASKING` on the same
    /// connection when `asking`), loading it first if this Redis lacks it.
    pub(super) async fn run(
        &self,
        script: &Script,
        keys: &[String],
        args: &[Value],
        asking: bool,
    ) -> Sent {
        let client = match self.client() {
            Ok(client) => client,
            Err(e) => return Sent::Failed(e),
        };
        let first = evalsha(&client, script, keys, args, asking).await;
        let result = match first {
            Err(e) if e.details().starts_with("NOSCRIPT") => {
                let lua = script
                    .lua()
                    .expect("scripts are built from their source")
                    .clone();
                match client.with_options(&once()).script_load::<(), _>(lua).await {
                    // Not run: NOSCRIPT is answered before anything runs.
                    Ok(()) => evalsha(&client, script, keys, args, asking).await,
                    Err(e) => Err(e),
                }
            }
            other => other,
        };
        match result {
            Ok(reply) => Sent::Reply(reply),
            Err(e) => match Redirect::parse(e.details()) {
                Some(redirect) => Sent::Redirect(redirect),
                None => Sent::Failed(self.error(&e)),
            },
        }
    }

    /// A raw command on this node (topology reads, script loads).
    pub(super) async fn command<R: FromValue>(
        &self,
        name: &'static str,
        args: Vec<Value>,
    ) -> Result<R, StoreError> {
        let client = self.client()?;
        client
            .with_options(&once())
            .custom::<R, Value>(
                CustomCommand::new_static(name, ClusterHash::FirstKey, false),
                args,
            )
            .await
            .map_err(|e| self.error(&e))
    }

    /// Builds a new client in place of any whose connection task has ended
    /// (fred gives up on a client in a few cases; a dead client must not
    /// stay in rotation for good).
    pub(super) fn renew(&self) {
        for slot in &self.conns {
            if !slot.read().task.is_finished() {
                continue;
            }
            match start(&self.builder, &self.auth_refused) {
                Ok(conn) => {
                    tracing::warn!(node = %self.name, "a Redis connection task ended; replaced it");
                    *slot.write() = conn;
                }
                Err(e) => {
                    tracing::error!(node = %self.name, error = %e, "cannot rebuild a Redis client")
                }
            }
        }
    }

    /// How long ago this node was first seen.
    pub(super) fn age(&self) -> Duration {
        self.created.elapsed()
    }

    /// Closes every connection. A client that is not connected (still
    /// connecting, or in reconnect back-off) would hold `QUIT` until it
    /// connects, so its connection task is stopped instead; the connected
    /// ones get at most two seconds.
    pub(super) async fn quit(&self) {
        let mut connected = Vec::new();
        for conn in &self.conns {
            let conn = conn.read();
            if conn.client.is_connected() {
                connected.push(conn.client.clone());
            } else {
                conn.task.abort();
            }
        }
        let all = futures_util::future::join_all(connected.iter().map(|c| c.quit()));
        let _ = tokio::time::timeout(Duration::from_secs(2), all).await;
    }
}

/// Builds one client, starts its connection task and its listeners.
fn start(builder: &Builder, auth_refused: &Arc<Mutex<Option<String>>>) -> Result<Conn, StoreError> {
    let client = builder
        .build()
        .map_err(|e| StoreError::Unavailable(e.to_string()))?;
    let refused = auth_refused.clone();
    client.on_error(move |(error, _)| {
        if *error.kind() == ErrorKind::Auth {
            *refused.lock() = Some(error.details().to_owned());
        }
        async { Ok(()) }
    });
    let refused = auth_refused.clone();
    client.on_reconnect(move |_| {
        *refused.lock() = None;
        async { Ok(()) }
    });
    let task = client.connect();
    Ok(Conn { client, task })
}

/// The error for refused credentials. Redis's own words (WRONGPASS, NOAUTH)
/// never contain the password.
fn auth_failed(node: &str, why: &str) -> StoreError {
    StoreError::Unavailable(format!(
        "Redis authentication failed at {node} (check the password and user): {why}"
    ))
}

/// One `EVALSHA`, preceded on the same connection by `ASKING` when asked: a
/// fred pipeline on a one-connection client writes its commands back to back
/// in the router task, so nothing else can come between them. (Sent as a
/// custom command because fred's per-command options do not reach its Lua
/// interface.)
async fn evalsha(
    client: &Client,
    script: &Script,
    keys: &[String],
    args: &[Value],
    asking: bool,
) -> Result<Vec<i64>, fred::error::Error> {
    let mut command: Vec<Value> = Vec::with_capacity(2 + keys.len() + args.len());
    command.push(Value::from(script.sha1().clone()));
    command.push(Value::from(keys.len() as i64));
    command.extend(keys.iter().map(|k| Value::from(k.as_str())));
    command.extend(args.iter().cloned());
    let eval = CustomCommand::new_static("EVALSHA", ClusterHash::FirstKey, false);
    let client = client.with_options(&once());
    if !asking {
        return client.custom::<Vec<i64>, Value>(eval, command).await;
    }
    let pipeline = fred::clients::Pipeline::from(client);
    let asking = CustomCommand::new_static("ASKING", ClusterHash::FirstKey, false);
    pipeline.custom::<(), Value>(asking, Vec::new()).await?;
    pipeline.custom::<(), Value>(eval, command).await?;
    let mut replies = pipeline.try_all::<Value>().await.into_iter();
    match (replies.next(), replies.next()) {
        (Some(Ok(_)), Some(reply)) => Vec::<i64>::from_value(reply?),
        (Some(Err(e)), _) => Err(e),
        _ => Err(fred::error::Error::new(
            ErrorKind::Protocol,
            "ASKING pipeline answered nothing",
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn redirects_are_read_from_error_replies() {
        assert_eq!(
            Redirect::parse("MOVED 3999 127.0.0.1:6381"),
            Some(Redirect::Moved {
                slot: 3999,
                address: "127.0.0.1:6381".into()
            })
        );
        assert_eq!(
            Redirect::parse("ASK 3999 10.0.0.2:7000"),
            Some(Redirect::Ask {
                address: "10.0.0.2:7000".into()
            })
        );
        assert_eq!(
            Redirect::parse("TRYAGAIN Multiple keys request during rehashing of slot"),
            Some(Redirect::TryAgain)
        );
        assert!(matches!(
            Redirect::parse("CLUSTERDOWN Hash slot not served"),
            Some(Redirect::Down(_))
        ));
        for other in ["NOSCRIPT No matching script", "ERR x", "MOVED x y", ""] {
            assert_eq!(Redirect::parse(other), None, "{other}");
        }
    }
}
