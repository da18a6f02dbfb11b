//! The Redis store: one `EVALSHA` of `redis/decide.lua` per request (per
//! slot group on Redis Cluster), through `fred`. The only module that sees
//! fred.
//!
//! Single Redis (or every key of the request in one slot): the script checks
//! and counts the whole request atomically. Redis Cluster with keys in
//! several slots: one call per slot group, in parallel, each counting its part
//! only if none of its enforcing limits is over; when the request as a whole
//! is rejected, the parts already counted are refunded (`redis/refund.lua`).
//! Between a part's count and its refund, a concurrent request may see those
//! hits and be rejected; it can never be admitted beyond the limit.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use fred::interfaces::{ClusterInterface, LuaInterface};
use fred::prelude::{
    Builder, ClientLike, Config, Options, ReconnectPolicy, Server, ServerConfig, TlsConnector,
};
use fred::types::Value;
use fred::types::config::ClusterDiscoveryPolicy;
use fred::types::scripts::Script;
use fred::types::{ClusterHash, CustomCommand};
use futures_util::future::join_all;
use serde::{Deserialize, Serialize};

use super::{Batch, BatchOutcome, CounterStore, LimitOutcome, StoreError, counted_used};
use crate::limiter::{Algorithm, Clock, LimitSpec, Role, admits};

const DECIDE: &str = include_str!("redis/decide.lua");
const REFUND: &str = include_str!("redis/refund.lua");

/// Where the scripts take `now` from.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize, Serialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum TimeSource {
    /// Redis `TIME`: one clock for every replica.
    #[default]
    Redis,
    /// The service's clock, passed to the script.
    Local,
}

/// A Redis URL whose password never appears in `Debug` or `Display`.
#[derive(Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(transparent)]
pub struct RedisUrl(String);

impl RedisUrl {
    /// Wraps a URL.
    pub fn new(url: impl Into<String>) -> Self {
        Self(url.into())
    }

    /// The URL with its password (for connecting only).
    pub fn expose(&self) -> &str {
        &self.0
    }

    /// The URL with `password` as its password (percent-encoded). A user
    /// name in the URL (`user:…@`) is kept; a password in it is replaced,
    /// including the `password@` form, which names no user. Lets a password
    /// kept in a Kubernetes Secret stay out of the URL.
    pub fn with_password(&self, password: &str) -> RedisUrl {
        let Some((scheme, rest)) = self.0.split_once("://") else {
            return self.clone();
        };
        let (user, hosts) = match rest.rsplit_once('@') {
            Some((auth, hosts)) => (auth.split_once(':').map_or("", |(u, _)| u), hosts),
            None => ("", rest),
        };
        RedisUrl(format!(
            "{scheme}://{user}:{}@{hosts}",
            percent_encode(password)
        ))
    }
}

/// Every byte but the URL's unreserved characters as `%XX`.
fn percent_encode(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for byte in text.bytes() {
        if byte.is_ascii_alphanumeric() || b"-._~".contains(&byte) {
            out.push(byte as char);
        } else {
            out.push_str(&format!("%{byte:02X}"));
        }
    }
    out
}

impl fmt::Display for RedisUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0.split_once("://") {
            Some((scheme, rest)) => match rest.rsplit_once('@') {
                Some((auth, host)) => {
                    let user = auth.split_once(':').map_or("", |(u, _)| u);
                    write!(f, "{scheme}://{user}:***@{host}")
                }
                None => f.write_str(&self.0),
            },
            None => f.write_str(&self.0),
        }
    }
}

impl fmt::Debug for RedisUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "\"{self}\"")
    }
}

/// Settings of the Redis store.
#[derive(Clone, Debug)]
pub struct RedisStoreConfig {
    /// `redis://[user:pass@]host:port[/db]`, `rediss://…` (TLS),
    /// `redis-cluster://host:port[,host:port…]` (`rediss-cluster://` for TLS),
    /// `redis-sentinel://host:port[,host:port…]/service`.
    pub url: RedisUrl,
    /// Connections (fred clients), used round-robin; each pipelines.
    pub pool_size: usize,
    /// Longest wait for one decision; past it the request fails UNAVAILABLE.
    pub timeout: Duration,
    /// Prepended to every key, so several services can share one Redis.
    pub key_prefix: String,
    /// Where `now` comes from.
    pub time: TimeSource,
}

/// The Redis counter store.
pub struct RedisStore {
    pool: fred::clients::Pool,
    decide: Script,
    refund: Script,
    prefix: String,
    /// `Some` in local time mode: the clock whose `now` is sent to the script.
    clock: Option<Arc<dyn Clock>>,
    timeout: Duration,
    cluster: bool,
}

/// Parses one of the accepted URL forms into a fred config.
fn parse_url(url: &RedisUrl) -> Result<Config, String> {
    let text = url.expose();
    let (scheme, rest) = text.split_once("://").ok_or("missing '://'")?;
    let (auth, rest) = match rest.rsplit_once('@') {
        Some((auth, rest)) => (Some(auth), rest),
        None => (None, rest),
    };
    let (username, password) = match auth {
        None => (None, None),
        Some(auth) => match auth.split_once(':') {
            Some((user, pass)) => (
                Some(percent_decode(user)?).filter(|u| !u.is_empty()),
                Some(percent_decode(pass)?),
            ),
            None => (None, Some(percent_decode(auth)?)),
        },
    };
    let (hosts, path) = match rest.split_once('/') {
        Some((hosts, path)) => (hosts, Some(path).filter(|p| !p.is_empty())),
        None => (rest, None),
    };
    let servers = hosts
        .split(',')
        .map(|h| {
            let (host, port) = h.rsplit_once(':').map_or((h, "6379"), |(h, p)| (h, p));
            let port: u16 = port.parse().map_err(|_| format!("invalid port in '{h}'"))?;
            if host.is_empty() {
                return Err(format!("missing host in '{h}'"));
            }
            Ok(Server::new(
                host.trim_start_matches('[').trim_end_matches(']'),
                port,
            ))
        })
        .collect::<Result<Vec<_>, String>>()?;
    let mut config = Config {
        username,
        password,
        ..Config::default()
    };
    let single = || match servers.as_slice() {
        [one] => Ok(one.clone()),
        _ => Err(format!(
            "{scheme}:// takes one host; use redis-cluster:// or redis-sentinel:// for several"
        )),
    };
    config.server = match scheme {
        "redis" | "rediss" => {
            if let Some(db) = path {
                config.database = Some(db.parse().map_err(|_| format!("invalid database '{db}'"))?);
            }
            ServerConfig::Centralized { server: single()? }
        }
        "redis-cluster" | "rediss-cluster" => {
            if path.is_some() {
                return Err("redis-cluster:// takes no database".into());
            }
            ServerConfig::Clustered {
                hosts: servers,
                policy: ClusterDiscoveryPolicy::default(),
            }
        }
        "redis-sentinel" | "rediss-sentinel" => {
            let service_name = path.ok_or(
                "redis-sentinel:// needs the service name: redis-sentinel://host:port/service",
            )?;
            ServerConfig::Sentinel {
                hosts: servers,
                service_name: service_name.to_owned(),
                username: config.username.clone(),
                password: config.password.clone(),
            }
        }
        other => {
            return Err(format!(
                "unsupported scheme '{other}' (use redis, rediss, redis-cluster or redis-sentinel)"
            ));
        }
    };
    if scheme.starts_with("rediss") {
        let connector = TlsConnector::default_rustls().map_err(|e| format!("TLS set-up: {e}"))?;
        config.tls = Some(connector.into());
    }
    Ok(config)
}

fn percent_decode(text: &str) -> Result<String, String> {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = text
                .get(i + 1..i + 3)
                .ok_or("truncated %-escape in the URL")?;
            out.push(u8::from_str_radix(hex, 16).map_err(|_| "invalid %-escape in the URL")?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).map_err(|_| "the URL's credentials are not UTF-8".into())
}

fn unavailable(e: impl fmt::Display) -> StoreError {
    StoreError::Unavailable(e.to_string())
}

/// `INFO commandstats` and `INFO cpu` of every primary that `url` names: the
/// one server, or each primary of a cluster. For `sluice bench`, which reads
/// what a run cost the Redis behind any RLS server.
pub async fn server_info(url: &RedisUrl) -> Result<Vec<String>, StoreError> {
    let config = parse_url(url)
        .map_err(|e| StoreError::Unavailable(format!("invalid Redis URL {url}: {e}")))?;
    let cluster = matches!(config.server, ServerConfig::Clustered { .. });
    let client = Builder::from_config(config)
        .with_connection_config(|c| c.connection_timeout = Duration::from_secs(5))
        .build()
        .map_err(unavailable)?;
    client.init().await.map_err(unavailable)?;
    // `None`: the one server the client is connected to.
    let servers: Vec<Option<Server>> = if cluster {
        client
            .cached_cluster_state()
            .map(|state| state.unique_primary_nodes())
            .unwrap_or_default()
            .into_iter()
            .map(Some)
            .collect()
    } else {
        vec![None]
    };
    let mut texts = Vec::with_capacity(servers.len());
    for server in servers {
        // One section per INFO: Redis before 7.0 takes only one.
        let mut text = String::new();
        for section in ["commandstats", "cpu"] {
            let command = CustomCommand::new_static("INFO", ClusterHash::Random, false);
            let args = vec![Value::from(section)];
            let part: String = match &server {
                Some(server) => {
                    client
                        .with_cluster_node(server.clone())
                        .custom(command, args)
                        .await
                }
                None => client.custom(command, args).await,
            }
            .map_err(unavailable)?;
            text.push_str(&part);
            text.push_str("\r\n");
        }
        texts.push(text);
    }
    let _ = client.quit().await;
    Ok(texts)
}

impl RedisStore {
    /// Connects (waiting at most `connect_timeout` for the first connection;
    /// if Redis is not there yet, requests fail UNAVAILABLE until it is) and
    /// loads the scripts. `clock` is used in local time mode.
    pub async fn connect(
        config: &RedisStoreConfig,
        clock: Arc<dyn Clock>,
        connect_timeout: Duration,
    ) -> Result<Self, StoreError> {
        let mut fred_config = parse_url(&config.url).map_err(|e| {
            StoreError::Unavailable(format!("invalid Redis URL {}: {e}", config.url))
        })?;
        // Keep reconnecting even when Redis is not up at start; commands fail
        // fast on their own (see `call`).
        fred_config.fail_fast = false;
        let cluster = matches!(fred_config.server, ServerConfig::Clustered { .. });
        let pool = Builder::from_config(fred_config)
            .with_connection_config(|c| {
                c.connection_timeout = connect_timeout.max(Duration::from_millis(100));
                // Never resend a script: it may already have counted.
                c.max_command_attempts = 1;
            })
            .set_policy(ReconnectPolicy::new_exponential(0, 50, 1_000, 2))
            .build_pool(config.pool_size.max(1))
            .map_err(unavailable)?;
        pool.connect();
        let store = Self {
            pool,
            decide: Script::from_lua(DECIDE),
            refund: Script::from_lua(REFUND),
            prefix: config.key_prefix.clone(),
            clock: (config.time == TimeSource::Local).then_some(clock),
            timeout: config.timeout,
            cluster,
        };
        match tokio::time::timeout(connect_timeout, store.pool.wait_for_connect()).await {
            Ok(Ok(())) => {
                store
                    .decide
                    .load(store.pool.next())
                    .await
                    .map_err(unavailable)?;
                store
                    .refund
                    .load(store.pool.next())
                    .await
                    .map_err(unavailable)?;
            }
            Ok(Err(e)) => {
                tracing::warn!(error = %e, url = %config.url, "Redis not reachable yet; requests fail UNAVAILABLE until it is")
            }
            Err(_) => {
                tracing::warn!(url = %config.url, "Redis not reachable yet; requests fail UNAVAILABLE until it is")
            }
        }
        Ok(store)
    }

    /// The pool, for callers that need raw commands (tests, the cost harness).
    pub fn pool(&self) -> &fred::clients::Pool {
        &self.pool
    }

    /// Closes every connection, waiting at most two seconds: a connection
    /// stuck in reconnect back-off (Redis down, or refusing our password)
    /// must not hold the process at shutdown.
    pub async fn quit(&self) {
        let _ = tokio::time::timeout(Duration::from_secs(2), self.pool.quit()).await;
    }

    /// One `EVALSHA` on the node owning the keys' slot, loading the script first if
    /// that Redis lacks it (a restarted Redis has no scripts). Never queued
    /// while disconnected and never retried: a resent script could count
    /// twice, and a queued one would count after its caller was told
    /// UNAVAILABLE. (Sent as a custom command because fred's per-command
    /// options do not reach its Lua interface.)
    async fn call(
        &self,
        script: &Script,
        keys: Vec<String>,
        args: Vec<Value>,
    ) -> Result<Vec<i64>, StoreError> {
        let slot = keys
            .first()
            .map_or(0, |k| fred::util::redis_keyslot(k.as_bytes()));
        let options = Options {
            fail_fast: true,
            max_attempts: Some(1),
            ..Options::default()
        };
        // Round-robin over the connections that are up, so one still in
        // reconnect back-off does not fail requests another could serve.
        let client = self.pool.next_connected();
        let fail_fast = client.with_options(&options);
        let evalsha = || {
            let mut command: Vec<Value> = Vec::with_capacity(2 + keys.len() + args.len());
            command.push(Value::from(script.sha1().clone()));
            command.push(Value::from(keys.len() as i64));
            command.extend(keys.iter().map(|k| Value::from(k.as_str())));
            command.extend(args.iter().cloned());
            fail_fast.custom::<Vec<i64>, Value>(
                CustomCommand::new_static("EVALSHA", ClusterHash::Custom(slot), false),
                command,
            )
        };
        let call = async {
            match evalsha().await {
                Err(e) if e.details().starts_with("NOSCRIPT") => {
                    let lua = script
                        .lua()
                        .expect("scripts are built from their source")
                        .clone();
                    client.script_load_cluster::<(), _>(lua).await?;
                    evalsha().await
                }
                result => result,
            }
        };
        match tokio::time::timeout(self.timeout, call).await {
            Ok(result) => result.map_err(unavailable),
            Err(_) => Err(StoreError::Timeout(self.timeout)),
        }
    }

    /// Runs decide.lua for `items` (indices into `batch.items`).
    async fn decide_part(
        &self,
        batch: &Batch,
        items: &[usize],
        keys: &[String],
        whole: bool,
        now: &Value,
    ) -> Result<Vec<i64>, StoreError> {
        let mut args = vec![now.clone(), Value::from(if whole { "all" } else { "part" })];
        for &i in items {
            let item = &batch.items[i];
            let role = match item.role {
                Role::Enforce => 0,
                Role::Shadow => 1,
                Role::Quota => 2,
            };
            args.extend([
                Value::from(role),
                hits(item.hits),
                Value::from(item.limits.len() as i64),
            ]);
            for limit in &item.limits {
                args.extend(limit_args(limit));
            }
        }
        let reply = self
            .call(
                &self.decide,
                items.iter().map(|&i| keys[i].clone()).collect(),
                args,
            )
            .await?;
        let expected = 2 + ANSWER_LEN
            * items
                .iter()
                .map(|&i| batch.items[i].limits.len())
                .sum::<usize>();
        if reply.len() != expected {
            return Err(StoreError::Unavailable(format!(
                "unexpected script reply of {} values",
                reply.len()
            )));
        }
        Ok(reply)
    }
}

fn hits(hits: u64) -> Value {
    Value::from(i64::try_from(hits).unwrap_or(i64::MAX))
}

/// `requests, duration_ms, algorithm, param` of one limit, as both scripts
/// take them.
fn limit_args(limit: &LimitSpec) -> [Value; 4] {
    let int = |n: u64| Value::from(i64::try_from(n).unwrap_or(i64::MAX));
    let (algorithm, param) = match limit.window.algorithm {
        Algorithm::SlidingWindow { precision_ms } => (0, precision_ms),
        Algorithm::FixedWindow => (1, 0),
        Algorithm::TokenBucket { burst } => (2, burst),
        Algorithm::SlidingLog => (3, 0),
    };
    [
        int(limit.requests),
        int(limit.window.duration_ms),
        Value::from(algorithm),
        int(param),
    ]
}

impl CounterStore for RedisStore {
    /// Ready while at least one connection is up.
    fn is_ready(&self) -> bool {
        self.pool.clients().iter().any(|c| c.is_connected())
    }

    async fn apply(&self, batch: &Batch) -> Result<BatchOutcome, StoreError> {
        let keys: Vec<String> = batch
            .items
            .iter()
            .map(|i| i.identity.storage_key(&self.prefix))
            .collect();
        let now = match &self.clock {
            Some(clock) => Value::from(i64::try_from(clock.now()).unwrap_or(i64::MAX)),
            None => Value::from(""),
        };
        // Group items by cluster slot; one group when not on a cluster.
        let mut groups: Vec<(u16, Vec<usize>)> = Vec::new();
        for (i, key) in keys.iter().enumerate() {
            let slot = if self.cluster {
                fred::util::redis_keyslot(key.as_bytes())
            } else {
                0
            };
            match groups.iter_mut().find(|(s, _)| *s == slot) {
                Some((_, members)) => members.push(i),
                None => groups.push((slot, vec![i])),
            }
        }
        if groups.len() <= 1 {
            let all: Vec<usize> = (0..batch.items.len()).collect();
            let reply = self.decide_part(batch, &all, &keys, true, &now).await?;
            let admitted = reply[0] == 1;
            let mut answers = answers(&reply);
            let limits = batch
                .items
                .iter()
                .flat_map(|item| item.limits.iter().map(move |_| item.hits))
                .zip(answers.by_ref())
                .map(|(hits, answer)| answer.outcome(admitted, hits))
                .collect();
            return Ok(BatchOutcome { admitted, limits });
        }

        let replies = join_all(
            groups
                .iter()
                .map(|(_, items)| self.decide_part(batch, items, &keys, false, &now)),
        )
        .await;
        // Each item's limit outcomes and the slots its hits went to, and
        // whether its group counted it.
        let mut per_item: Vec<Option<ItemPart>> = vec![None; batch.items.len()];
        let mut error = None;
        for ((_, items), reply) in groups.iter().zip(&replies) {
            match reply {
                Ok(reply) => {
                    let mut values = answers(reply);
                    for &i in items {
                        let limits = values.by_ref().take(batch.items[i].limits.len()).collect();
                        per_item[i] = Some((limits, reply[0] == 1));
                    }
                }
                Err(e) => error = Some(e.clone()),
            }
        }
        let admitted = error.is_none()
            && admits(batch.items.iter().zip(&per_item).map(|(item, outcome)| {
                let over = outcome
                    .as_ref()
                    .is_some_and(|(limits, _)| limits.iter().any(|a| a.over));
                (item.role, over)
            }));
        if !admitted {
            self.refund(batch, &keys, &per_item).await;
        }
        if let Some(e) = error {
            return Err(e);
        }
        let limits = batch
            .items
            .iter()
            .zip(per_item)
            .flat_map(|(item, outcome)| {
                let (limits, _) = outcome.expect("every group answered");
                // A refunded part reports the counter as it stands again.
                limits
                    .into_iter()
                    .map(move |a| a.outcome(admitted, item.hits))
            })
            .collect();
        Ok(BatchOutcome { admitted, limits })
    }
}

impl RedisStore {
    /// Takes back the hits of every item whose group counted it: one call
    /// per slot, since a script may only touch keys of one slot.
    async fn refund(&self, batch: &Batch, keys: &[String], per_item: &[Option<ItemPart>]) {
        let mut by_slot: Vec<(u16, Vec<String>, Vec<Value>)> = Vec::new();
        for (i, outcome) in per_item.iter().enumerate() {
            let Some((answers, true)) = outcome else {
                continue;
            };
            let item = &batch.items[i];
            let slot = fred::util::redis_keyslot(keys[i].as_bytes());
            let group = match by_slot.iter().position(|(s, _, _)| *s == slot) {
                Some(g) => g,
                None => {
                    by_slot.push((slot, Vec::new(), Vec::new()));
                    by_slot.len() - 1
                }
            };
            let (_, group_keys, args) = &mut by_slot[group];
            group_keys.push(keys[i].clone());
            args.push(Value::from(answers.len() as i64));
            for (limit, answer) in item.limits.iter().zip(answers) {
                args.extend(limit_args(limit));
                args.extend([Value::from(answer.slot), hits(item.hits)]);
            }
        }
        let calls = by_slot
            .into_iter()
            .map(|(_, keys, args)| self.call(&self.refund, keys, args));
        for result in join_all(calls).await {
            if let Err(e) = result {
                tracing::error!(error = %e, "could not refund the counted part of a rejected request; it stays counted until its window passes");
            }
        }
    }
}

/// One item's answers from its slot group, and whether the group counted it.
type ItemPart = (Vec<Answer>, bool);

/// Values per limit in a decide.lua reply.
const ANSWER_LEN: usize = 8;

/// One limit's answer from decide.lua.
#[derive(Clone, Copy, Debug)]
struct Answer {
    before: u64,
    pending: u64,
    over: bool,
    /// Until headroom grows, before this request was counted.
    reset_before: u64,
    /// The same after it was counted (equal when nothing was counted).
    reset_after: u64,
    /// For how long no hit can fit, before this request was counted.
    full_before: u64,
    /// The same after it was counted.
    full_after: u64,
    /// The bucket or window the hits went to, for a refund.
    slot: i64,
}

impl Answer {
    /// The outcome to report: after the request when it was admitted, the
    /// counter as it stands otherwise (also for a refunded Cluster part).
    fn outcome(self, admitted: bool, hits: u64) -> LimitOutcome {
        LimitOutcome {
            used: counted_used(admitted, self.before, self.pending, hits),
            over: self.over,
            reset_ms: if admitted {
                self.reset_after
            } else {
                self.reset_before
            },
            full_for_ms: if admitted {
                self.full_after
            } else {
                self.full_before
            },
        }
    }
}

/// The per-limit answers of a decide.lua reply.
fn answers(reply: &[i64]) -> impl Iterator<Item = Answer> + '_ {
    let count = |v: i64| u64::try_from(v).unwrap_or(0);
    reply[2..].chunks(ANSWER_LEN).map(move |v| Answer {
        before: count(v[0]),
        pending: count(v[1]),
        over: v[2] == 1,
        reset_before: count(v[3]),
        reset_after: count(v[4]),
        full_before: count(v[5]),
        full_after: count(v[6]),
        slot: v[7],
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwords_never_show_in_debug_or_display() {
        let url = RedisUrl::new("redis://alice:s3cret@redis:6379/0");
        assert_eq!(url.to_string(), "redis://alice:***@redis:6379/0");
        assert!(!format!("{url:?}").contains("s3cret"));
        assert_eq!(
            RedisUrl::new("redis://redis:6379").to_string(),
            "redis://redis:6379"
        );
    }

    #[test]
    fn a_separate_password_is_encoded_into_the_url() {
        let password = "p@ss:w/rd %ü";
        for (url, user) in [
            ("redis://redis:6379/1", None),
            ("redis://alice:@redis:6379", Some("alice")),
            ("redis://stale@redis:6379", None),
            ("redis://alice:old@redis:6379", Some("alice")),
            ("redis://:old@redis:6379", None),
            ("redis-cluster://a:7000,b:7001", None),
            ("rediss-sentinel://s1:26379,s2:26379/mymaster", None),
        ] {
            let merged = RedisUrl::new(url).with_password(password);
            let c = parse_url(&merged).unwrap_or_else(|e| panic!("{url}: {e}"));
            assert_eq!(
                (c.username.as_deref(), c.password.as_deref()),
                (user, Some(password)),
                "{url} -> {}",
                merged.expose()
            );
            assert!(!merged.to_string().contains("p@ss"), "{merged}");
        }
        let merged = RedisUrl::new("redis://redis:6379/1").with_password("x");
        assert_eq!(merged.expose(), "redis://:x@redis:6379/1");
    }

    #[test]
    fn url_forms_map_to_fred_configs() {
        let c = parse_url(&RedisUrl::new("redis://alice:p%40ss@127.0.0.1:7000/2")).unwrap();
        assert_eq!(
            (c.username.as_deref(), c.password.as_deref(), c.database),
            (Some("alice"), Some("p@ss"), Some(2))
        );
        assert!(matches!(c.server, ServerConfig::Centralized { .. }));
        let c = parse_url(&RedisUrl::new(
            "redis-cluster://127.0.0.1:7000,127.0.0.1:7001",
        ))
        .unwrap();
        assert!(matches!(c.server, ServerConfig::Clustered { ref hosts, .. } if hosts.len() == 2));
        let c = parse_url(&RedisUrl::new(
            "redis-sentinel://10.0.0.1:26379,10.0.0.2:26379/mymaster",
        ))
        .unwrap();
        assert!(
            matches!(c.server, ServerConfig::Sentinel { ref service_name, .. } if service_name == "mymaster")
        );
        assert!(
            parse_url(&RedisUrl::new("rediss://redis:6380"))
                .unwrap()
                .tls
                .is_some()
        );
        for bad in [
            "redis:/x",
            "http://h:1",
            "redis://h:notaport",
            "redis://a:1,b:2",
            "redis-sentinel://h:1",
            "redis://h:1/db",
        ] {
            assert!(
                parse_url(&RedisUrl::new(bad)).is_err(),
                "{bad} should be rejected"
            );
        }
    }
}
