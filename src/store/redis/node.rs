//! One Redis to talk to: a single server, a Sentinel-managed service, or one
//! primary of a Cluster. A node holds a few connections of its own (each
//! redis-rs multiplexed: many calls in flight on one socket), its circuit
//! breaker, and the reason its last connection attempt was refused, so that
//! a wrong password is named.
//!
//! Each connection has a task of its own that makes it (`dial.rs`), waits
//! for it to end, and makes it again, from 0 up to 1 s apart, forever: a
//! broken connection is replaced without any caller waiting for it. A
//! connection is also replaced when it stops answering (a `PING` every
//! [`PROBE_EVERY`] must be answered within [`STUCK_AFTER`]: a lost host
//! leaves a socket that never breaks by itself) and when it answers
//! `READONLY` (its Redis was demoted to a replica; dialling again finds the
//! new primary through Sentinel, or a Service or DNS name that moved).
//! Nothing is ever resent: a call on a connection that breaks fails, and a
//! call only ever goes to a connection that is up (none up: it fails at
//! once rather than queue).

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use parking_lot::{Mutex, RwLock};
use redis::aio::MultiplexedConnection;
use redis::{Cmd, FromRedisValue, RedisError, Value};
use tokio::sync::Notify;
use tokio::task::AbortHandle;

use super::dial::{DialError, Dialer, Place, refusal};
use super::wire::{self, Packing};
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

/// A Lua script: its source, sent by `SCRIPT LOAD` to a Redis that lacks
/// it, its SHA1, by which it is called, and how its packed reply reads.
#[derive(Clone, Debug)]
pub(super) struct Script {
    lua: &'static str,
    sha1: Arc<str>,
    packing: Packing,
}

impl Script {
    /// A script whose packed reply holds 8-byte integers.
    pub(super) fn new(lua: &'static str) -> Script {
        Script::with_packing(lua, Packing::Integers)
    }

    /// A script whose packed reply reads as `packing` says.
    pub(super) fn with_packing(lua: &'static str, packing: Packing) -> Script {
        let sha1 = redis::Script::new(lua).get_hash().into();
        Script { lua, sha1, packing }
    }

    /// `SCRIPT LOAD` of this script.
    pub(super) fn load(&self) -> Cmd {
        let mut cmd = redis::cmd("SCRIPT");
        cmd.arg("LOAD").arg(self.lua);
        cmd
    }
}

/// One script call, ready to send (and to send again after a redirect):
/// `EVALSHA sha1 #keys keys… args…`.
pub(super) struct Eval {
    pub(super) script: Script,
    /// The Cluster slot of its keys (all in one; 0 off a Cluster).
    pub(super) slot: u16,
    /// The command; its arguments are appended by the caller.
    pub(super) cmd: Cmd,
}

impl Eval {
    /// A call of `script` on `keys`, which live in `slot`, without
    /// arguments yet; room is made for `args` of them, numbers (the command
    /// is built for every decision: growing it cost reallocations).
    pub(super) fn new<K, I>(script: &Script, keys: I, slot: u16, args: usize) -> Eval
    where
        K: AsRef<str>,
        I: IntoIterator<Item = K, IntoIter: ExactSizeIterator + Clone>,
    {
        let keys = keys.into_iter();
        let key_bytes: usize = keys.clone().map(|k| k.as_ref().len()).sum();
        let mut cmd = Cmd::with_capacity(
            3 + keys.len() + args,
            "EVALSHA".len() + script.sha1.len() + 2 + key_bytes + 8 * args,
        );
        cmd.arg("EVALSHA").arg(&*script.sha1).arg(keys.len());
        for key in keys {
            cmd.arg(key.as_ref());
        }
        Eval {
            script: script.clone(),
            slot,
            cmd,
        }
    }
}

/// How often a connection that is up is asked `PING`.
const PROBE_EVERY: Duration = Duration::from_secs(2);
/// A connection that has not answered a `PING` for this long is replaced.
/// A Redis that is only busy answers sooner (a script past
/// `busy-reply-threshold`, 5 s by default, gets `BUSY` replies), and a late
/// reply is waited for no longer than this anyway (`RECONCILE_WAIT`).
const STUCK_AFTER: Duration = Duration::from_secs(10);

/// One connection of a node.
#[derive(Default)]
struct Line {
    /// Up (`Some`), or being made again (`None`).
    conn: RwLock<Option<MultiplexedConnection>>,
    /// Asks the line's task to replace the connection now.
    replace: Notify,
}

/// One Redis target and its connections.
pub(super) struct Node {
    name: NodeName,
    /// Read by every call (a cheap clone of the connection under a read
    /// lock), written only by each line's own task as it connects and
    /// disconnects.
    lines: Vec<Arc<Line>>,
    /// The tasks that keep the lines connected, stopped at `quit`.
    keepers: Vec<AbortHandle>,
    /// Round-robin position.
    next: AtomicUsize,
    /// This node's breaker: a dead node fails fast without failing others.
    pub(super) circuit: Circuit,
    /// Why the last connection attempt failed (Redis refusing our
    /// credentials, or not reachable), until one succeeds again; written by
    /// the lines' tasks, read to say why a call cannot be made.
    last_failure: Arc<Mutex<Option<DialError>>>,
    created: Instant,
}

impl Node {
    /// A node at `place` with `size` connections, connecting in the
    /// background.
    pub(super) fn new(name: NodeName, dialer: Arc<Dialer>, place: Place, size: usize) -> Node {
        let last_failure = Arc::new(Mutex::new(None));
        let lines: Vec<Arc<Line>> = (0..size.max(1)).map(|_| Arc::default()).collect();
        let keepers = lines
            .iter()
            .map(|line| {
                let keeper = Keeper {
                    line: line.clone(),
                    dialer: dialer.clone(),
                    place: place.clone(),
                    name: name.clone(),
                    last_failure: last_failure.clone(),
                };
                tokio::spawn(keeper.run()).abort_handle()
            })
            .collect();
        Node {
            name,
            lines,
            keepers,
            next: AtomicUsize::new(0),
            circuit: Circuit::default(),
            last_failure,
            created: Instant::now(),
        }
    }

    pub(super) fn name(&self) -> &NodeName {
        &self.name
    }

    /// Whether any connection is up.
    pub(super) fn is_connected(&self) -> bool {
        self.lines.iter().any(|line| line.conn.read().is_some())
    }

    /// Waits (at most `limit`) until a connection is up or Redis has refused
    /// our credentials.
    pub(super) async fn wait_connected(&self, limit: Duration) -> bool {
        let deadline = Instant::now() + limit;
        loop {
            if self.is_connected() {
                return true;
            }
            let refused = matches!(*self.last_failure.lock(), Some(DialError::Refused(_)));
            if refused || Instant::now() >= deadline {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    /// A connection that is up, round-robin; none while every one is down.
    pub(super) fn connection(&self) -> Result<MultiplexedConnection, StoreError> {
        self.connection_on_line().map(|(conn, _)| conn)
    }

    /// A connection that is up, round-robin, with its line; none while
    /// every one is down (the call then fails at once rather than queue).
    fn connection_on_line(&self) -> Result<(MultiplexedConnection, &Line), StoreError> {
        let start = self.next.fetch_add(1, Ordering::Relaxed);
        (0..self.lines.len())
            .find_map(|i| {
                let line = &self.lines[(start + i) % self.lines.len()];
                let conn = line.conn.read().clone()?;
                Some((conn, &**line))
            })
            .ok_or_else(|| self.down())
    }

    /// Why this node cannot take a call now.
    pub(super) fn down(&self) -> StoreError {
        match &*self.last_failure.lock() {
            Some(DialError::Refused(why)) => auth_failed(&self.name, why),
            Some(DialError::Failed(why)) => StoreError::Unavailable(format!(
                "Redis at {} is not connected (last attempt: {why})",
                self.name
            )),
            None => StoreError::Unavailable(format!("Redis at {} is not connected", self.name)),
        }
    }

    /// A redis-rs error as a store error, naming refused credentials.
    fn error(&self, e: &RedisError) -> StoreError {
        match refusal(e) {
            Some(DialError::Refused(why)) => auth_failed(&self.name, &why),
            _ => StoreError::Unavailable(format!("Redis at {}: {e}", self.name)),
        }
    }

    /// Runs `eval` once on this node (after `ASKING` on the same
    /// connection when `asking`), loading its script first if this Redis
    /// lacks it.
    pub(super) async fn run(&self, eval: &Eval, asking: bool) -> Sent {
        let (mut conn, line) = match self.connection_on_line() {
            Ok(up) => up,
            Err(e) => return Sent::Failed(e),
        };
        let mut result = send(&mut conn, &eval.cmd, asking).await;
        if matches!(&result, Err(e) if e.code() == Some("NOSCRIPT")) {
            // Not run: NOSCRIPT is answered before anything runs.
            result = match conn.send_packed_command(&eval.script.load()).await {
                Ok(_) => send(&mut conn, &eval.cmd, asking).await,
                Err(e) => Err(e),
            };
        }
        if matches!(&result, Err(e) if e.code() == Some("READONLY")) {
            // Demoted to a replica: dialling again finds the primary.
            line.replace.notify_waiters();
        }
        match result
            .and_then(|reply| wire::script_reply(reply, eval.script.packing).map_err(Into::into))
        {
            Ok(reply) => Sent::Reply(reply),
            Err(e) => match Redirect::parse(&error_text(&e)) {
                Some(redirect) => Sent::Redirect(redirect),
                None => Sent::Failed(self.error(&e)),
            },
        }
    }

    /// A command on this node (topology reads, script loads).
    pub(super) async fn command<R: FromRedisValue>(&self, cmd: &Cmd) -> Result<R, StoreError> {
        let mut conn = self.connection()?;
        let reply = conn
            .send_packed_command(cmd)
            .await
            .map_err(|e| self.error(&e))?;
        R::from_redis_value(reply).map_err(|e| self.error(&e.into()))
    }

    /// How long ago this node was first seen.
    pub(super) fn age(&self) -> Duration {
        self.created.elapsed()
    }

    /// Closes every connection (calls in flight on them fail) and stops
    /// making new ones.
    pub(super) fn quit(&self) {
        for keeper in &self.keepers {
            keeper.abort();
        }
        for line in &self.lines {
            line.conn.write().take();
        }
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        self.quit();
    }
}

/// The task behind one connection of a node: makes it, waits for it to
/// end, makes it again.
struct Keeper {
    line: Arc<Line>,
    dialer: Arc<Dialer>,
    place: Place,
    name: NodeName,
    last_failure: Arc<Mutex<Option<DialError>>>,
}

impl Keeper {
    async fn run(self) {
        let mut backoff = Backoff::default();
        loop {
            let pause = match self.dialer.connect(&self.place).await {
                Ok((conn, traffic)) => {
                    let up = Instant::now();
                    *self.last_failure.lock() = None;
                    *self.line.conn.write() = Some(conn.clone());
                    // Aborted with this task (`quit`), or when the
                    // connection is replaced, so the socket closes.
                    let traffic = AbortOnDrop(traffic);
                    tokio::select! {
                        _ = traffic.wait() => {
                            tracing::warn!(node = %self.name, "Redis connection lost; reconnecting");
                        }
                        () = self.line.replace.notified() => {
                            tracing::warn!(node = %self.name, "Redis answered READONLY (no longer a primary); reconnecting");
                        }
                        () = stuck(conn) => {
                            tracing::warn!(node = %self.name, after = ?STUCK_AFTER, "Redis connection gave no answer; replacing it");
                        }
                    }
                    self.line.conn.write().take();
                    backoff.lost(up.elapsed())
                }
                Err(failure) => {
                    if let DialError::Failed(why) = &failure {
                        tracing::debug!(node = %self.name, error = %why, "no Redis connection yet");
                    }
                    *self.last_failure.lock() = Some(failure);
                    backoff.failed()
                }
            };
            tokio::time::sleep(pause).await;
        }
    }
}

/// Returns once `conn` has not answered a `PING` for [`STUCK_AFTER`];
/// any answer, an error included, shows it alive.
async fn stuck(mut conn: MultiplexedConnection) {
    let ping = redis::cmd("PING");
    loop {
        tokio::time::sleep(PROBE_EVERY).await;
        if tokio::time::timeout(STUCK_AFTER, conn.send_packed_command(&ping))
            .await
            .is_err()
        {
            return;
        }
    }
}

/// How long a keeper waits before its next connection attempt: at once
/// after a connection that served a while, and otherwise twice as long as
/// the last time (50 ms to 1 s). A connection that opens and is closed at
/// once (Redis at `maxclients`, a proxy whose Redis is down) counts as a
/// failed attempt, or the keeper would redial it in a tight loop.
#[derive(Debug, Default)]
struct Backoff {
    pause: Duration,
}

impl Backoff {
    /// A connection that lived this long is taken to have worked.
    const STABLE: Duration = Duration::from_secs(1);
    const FIRST: Duration = Duration::from_millis(50);
    const MOST: Duration = Duration::from_secs(1);

    /// The pause after a connection that was up for `lived`.
    fn lost(&mut self, lived: Duration) -> Duration {
        if lived >= Self::STABLE {
            self.pause = Self::FIRST;
            return Duration::ZERO;
        }
        self.failed()
    }

    /// The pause after an attempt that failed.
    fn failed(&mut self) -> Duration {
        let pause = self.pause;
        self.pause = (pause * 2).clamp(Self::FIRST, Self::MOST);
        pause
    }
}

/// A task that is stopped when its handle is dropped.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl AbortOnDrop {
    async fn wait(mut self) -> Result<(), tokio::task::JoinError> {
        (&mut self.0).await
    }
}

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// The error for refused credentials. Redis's own words (WRONGPASS, NOAUTH)
/// never contain the password.
fn auth_failed(node: &str, why: &str) -> StoreError {
    StoreError::Unavailable(format!(
        "Redis authentication failed at {node} (check the password and user): {why}"
    ))
}

/// A server error as Redis wrote it (`MOVED 3999 10.0.0.2:7000`), for
/// [`Redirect::parse`].
fn error_text(e: &RedisError) -> String {
    match (e.code(), e.detail()) {
        (Some(code), Some(detail)) => format!("{code} {detail}"),
        (Some(code), None) => code.to_owned(),
        _ => String::new(),
    }
}

/// One command, preceded on the same connection by `ASKING` when asked: a
/// pipeline of two is written to the socket in one piece, so nothing else
/// can come between them.
async fn send(
    conn: &mut MultiplexedConnection,
    cmd: &Cmd,
    asking: bool,
) -> Result<Value, RedisError> {
    if !asking {
        return match conn.send_packed_command(cmd).await? {
            Value::ServerError(e) => Err(e.into()),
            reply => Ok(reply),
        };
    }
    let mut pipeline = redis::pipe();
    pipeline.cmd("ASKING").add_command(cmd.clone());
    let mut replies = conn
        .send_packed_commands(&pipeline, 0, 2)
        .await?
        .into_iter();
    match (replies.next(), replies.next()) {
        (Some(Value::ServerError(e)), _) | (_, Some(Value::ServerError(e))) => Err(e.into()),
        (Some(_), Some(reply)) => Ok(reply),
        _ => Err(RedisError::from((
            redis::ErrorKind::Parse,
            "ASKING pipeline answered nothing",
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reconnects_back_off_unless_the_connection_served_a_while() {
        let mut backoff = Backoff::default();
        // The first failure retries at once, then 50 ms, doubling to 1 s.
        let failures: Vec<_> = (0..7).map(|_| backoff.failed()).collect();
        let ms = Duration::from_millis;
        assert_eq!(
            failures,
            [ms(0), ms(50), ms(100), ms(200), ms(400), ms(800), ms(1000)]
        );
        // Connections that open and close at once keep backing off.
        assert_eq!(backoff.lost(ms(2)), ms(1000));
        let mut flapping = Backoff::default();
        let flaps: Vec<_> = (0..4).map(|_| flapping.lost(ms(2))).collect();
        assert_eq!(flaps, [ms(0), ms(50), ms(100), ms(200)]);
        // One that served a while is redialled at once, and failures after
        // it start the ladder again.
        assert_eq!(flapping.lost(Duration::from_secs(30)), ms(0));
        assert_eq!(flapping.failed(), ms(50));
        assert_eq!(flapping.failed(), ms(100));
    }

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
