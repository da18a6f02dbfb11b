//! How the Redis store reaches Redis beyond plain TCP, against real
//! `redis-server` processes: TLS with a private CA, a client certificate
//! (`tls-auth-clients yes`) and a certificate whose name is not the host's
//! (each refused when it should be); a unix socket; and a second Redis for
//! per-second limits (envoyproxy/ratelimit's `REDIS_PERSECOND`), exact
//! across the two; a Sentinel-managed primary, followed through a failover
//! with its counters intact, also when its host is lost; and a connection
//! to a primary demoted outside Sentinel, dialled again.

use crate::support;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::future::join_all;
use sluice::limiter::{Algorithm, LimitSpec, ManualClock, Window};
use sluice::store::{
    Batch, BatchItem, CounterStore, RedisStore, RedisStoreConfig, RedisTls, RedisUrl, StoreError,
    TimeSource,
};
use support::certs::Ca;
use support::eventually::{eventually, eventually_async};
use support::per_minute;
use support::redis::{RedisServer, Reply, free_port};

/// How long a store waits for Redis at start and for each call.
const WAIT: Duration = Duration::from_secs(2);

fn config(url: &str, tls: RedisTls, per_second_url: Option<String>) -> RedisStoreConfig {
    RedisStoreConfig {
        url: RedisUrl::new(url),
        per_second_url: per_second_url.map(RedisUrl::new),
        coalesce: true,
        tls,
        pool_size: 1,
        timeout: WAIT,
        key_prefix: support::unique_prefix(),
        // The test's clock: a one-second window must not roll over mid-test.
        time: TimeSource::Local,
        breaker: None,
    }
}

async fn connect(config: &RedisStoreConfig) -> Result<RedisStore, StoreError> {
    RedisStore::connect(config, Arc::new(ManualClock::new(support::T0)), WAIT).await
}

fn item(name: &str, limit: LimitSpec) -> BatchItem {
    support::enforcing("connections", name, limit, 1)
}

fn per_second(requests: u64) -> LimitSpec {
    LimitSpec {
        requests,
        window: Window {
            duration_ms: 1_000,
            algorithm: Algorithm::FixedWindow,
        },
        penalty: None,
    }
}

/// Whether the request of `items` is admitted; panics on a store error.
async fn admitted(store: &RedisStore, items: &[BatchItem]) -> bool {
    let batch = Batch {
        items: items.to_vec(),
    };
    store.apply(&batch).await.expect("a decision").admitted
}

/// What `store` reports used for `item`'s limit, without counting.
async fn used(store: &RedisStore, item: &BatchItem) -> u64 {
    let mut peek = item.clone();
    peek.hits = 0;
    let batch = Batch { items: vec![peek] };
    store.apply(&batch).await.expect("a decision").limits[0].used
}

/// Whether the Redis on `port` holds `key`.
fn holds(port: u16, key: &str) -> bool {
    support::redis::query(port, &["EXISTS", key]) == Reply::Integer(1)
}

// ------------------------------------------------------------------- TLS

/// Writes `ca`'s certificate as `<stem>.crt` in `dir`.
fn write_ca(ca: &Ca, dir: &Path, stem: &str) -> PathBuf {
    let path = dir.join(format!("{stem}.crt"));
    std::fs::write(&path, ca.pem()).unwrap();
    path
}

/// Writes a certificate from `ca` for `name` as `<stem>.crt` and
/// `<stem>.key` in `dir` (no extended key usage: it serves either side).
fn write_leaf(ca: &Ca, dir: &Path, stem: &str, name: &str) -> (PathBuf, PathBuf) {
    let leaf = ca.leaf_for(name);
    let (crt, key) = (
        dir.join(format!("{stem}.crt")),
        dir.join(format!("{stem}.key")),
    );
    std::fs::write(&crt, leaf.cert_pem).unwrap();
    std::fs::write(&key, leaf.key_pem).unwrap();
    (crt, key)
}

/// A Redis serving TLS on its own port with a certificate for
/// `redis.internal` only (not the address dialled), demanding a client
/// certificate from `ca`. None, saying so, when the server under test was
/// built without TLS (PyPI's valkey-server).
struct TlsRedis {
    _server: RedisServer,
    tls_port: u16,
    dir: tempfile::TempDir,
    ca: Ca,
}

impl TlsRedis {
    fn start() -> Option<Self> {
        if let Some(why) = support::redis::tls_unsupported() {
            eprintln!("skipped: this test needs a Redis with TLS; {why}");
            return None;
        }
        let dir = tempfile::tempdir().unwrap();
        let ca = Ca::new("redis-ca");
        let ca_file = write_ca(&ca, dir.path(), "ca");
        let (cert, key) = write_leaf(&ca, dir.path(), "server", "redis.internal");
        let tls_port = free_port();
        let port = tls_port.to_string();
        let server = RedisServer::start_with(&[
            "--tls-port",
            &port,
            "--tls-cert-file",
            cert.to_str().unwrap(),
            "--tls-key-file",
            key.to_str().unwrap(),
            "--tls-ca-cert-file",
            ca_file.to_str().unwrap(),
            "--tls-auth-clients",
            "yes",
        ]);
        Some(Self {
            _server: server,
            tls_port,
            dir,
            ca,
        })
    }

    fn url(&self) -> String {
        format!("rediss://127.0.0.1:{}", self.tls_port)
    }

    /// Everything a client needs: the CA, a client certificate from it,
    /// and no name check.
    fn client_tls(&self) -> RedisTls {
        RedisTls {
            ca: Some(self.dir.path().join("ca.crt")),
            client: Some(write_leaf(&self.ca, self.dir.path(), "client", "sluice")),
            skip_hostname_verification: true,
        }
    }
}

#[tokio::test]
async fn tls_with_a_private_ca_a_client_certificate_and_any_name_counts() {
    let Some(redis) = TlsRedis::start() else {
        return;
    };
    let store = connect(&config(&redis.url(), redis.client_tls(), None))
        .await
        .expect("connect");
    assert!(store.is_ready(), "connected over TLS");
    let limited = item("tls", per_minute(2));
    let decisions = [
        admitted(&store, std::slice::from_ref(&limited)).await,
        admitted(&store, std::slice::from_ref(&limited)).await,
        admitted(&store, std::slice::from_ref(&limited)).await,
    ];
    assert_eq!(decisions, [true, true, false]);
}

#[tokio::test]
async fn tls_refuses_a_wrong_name_a_missing_client_certificate_and_a_foreign_ca() {
    let Some(redis) = TlsRedis::start() else {
        return;
    };
    let other = Ca::new("someone-else");
    let other_ca = write_ca(&other, redis.dir.path(), "other-ca");
    let good = redis.client_tls();
    let cases = [
        (
            "the certificate names redis.internal, not 127.0.0.1",
            RedisTls {
                skip_hostname_verification: false,
                ..good.clone()
            },
        ),
        (
            "Redis demands a client certificate",
            RedisTls {
                client: None,
                ..good.clone()
            },
        ),
        (
            "the server's chain does not lead to the CA given (names unchecked)",
            RedisTls {
                ca: Some(other_ca),
                client: Some(write_leaf(&other, redis.dir.path(), "stranger", "sluice")),
                skip_hostname_verification: true,
            },
        ),
    ];
    for (why, tls) in cases {
        let store = connect(&config(&redis.url(), tls, None))
            .await
            .expect("start-up goes on without Redis");
        assert!(!store.is_ready(), "{why}: must not connect");
        let batch = Batch {
            items: vec![item("refused", per_minute(2))],
        };
        assert!(
            matches!(
                store.apply(&batch).await,
                Err(StoreError::Unavailable(_) | StoreError::Timeout(_))
            ),
            "{why}: a decision must fail UNAVAILABLE"
        );
        store.quit();
    }
}

#[tokio::test]
async fn tls_files_without_a_rediss_url_are_refused_at_start() {
    let Some(redis) = TlsRedis::start() else {
        return;
    };
    let url = format!("redis://127.0.0.1:{}", redis.tls_port);
    let refused = connect(&config(&url, redis.client_tls(), None)).await;
    match refused {
        Err(StoreError::Unavailable(why)) => assert!(why.contains("rediss://"), "{why}"),
        other => panic!("expected a refusal naming rediss://, got {:?}", other.err()),
    }
}

// ----------------------------------------------------------- unix socket

#[tokio::test]
async fn a_unix_socket_reaches_the_same_counters() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("redis.sock");
    let redis = RedisServer::start_with(&[
        "--unixsocket",
        socket.to_str().unwrap(),
        "--unixsocketperm",
        "700",
    ]);
    let config = config(
        &format!("redis+unix://{}", socket.display()),
        RedisTls::default(),
        None,
    );
    let store = connect(&config).await.expect("connect");
    let limited = item("unix", per_minute(1));
    assert!(admitted(&store, std::slice::from_ref(&limited)).await);
    assert!(!admitted(&store, std::slice::from_ref(&limited)).await);
    let key = limited.identity.storage_key(&config.key_prefix);
    assert!(
        holds(redis.port(), &key),
        "the counter is in the Redis behind the socket"
    );
}

// --------------------------------------------------------------- Sentinel

/// The port of the primary `sentinel` names for `mymaster`.
fn named_primary(sentinel: &RedisServer) -> String {
    let reply = sentinel.query(&["SENTINEL", "GET-MASTER-ADDR-BY-NAME", "mymaster"]);
    reply
        .items()
        .get(1)
        .map(Reply::to_string)
        .unwrap_or_default()
}

/// A primary, its replica and a sentinel watching them, a store that
/// reaches the primary through the sentinel, and the limit (5 a minute)
/// of `name`, admitted 3 times and copied to the replica.
struct Watched {
    primary: RedisServer,
    replica: RedisServer,
    sentinel: RedisServer,
    store: RedisStore,
    limited: BatchItem,
}

async fn watched_by_a_sentinel(name: &str) -> Watched {
    let primary = RedisServer::start();
    let replica =
        RedisServer::start_with(&["--replicaof", "127.0.0.1", &primary.port().to_string()]);
    let sentinel = RedisServer::start_sentinel(primary.port());
    eventually("the sentinel to find the replica", || {
        sentinel
            .query(&["SENTINEL", "REPLICAS", "mymaster"])
            .items()
            .len()
            == 1
    });
    let url = format!("redis-sentinel://127.0.0.1:{}/mymaster", sentinel.port());
    let store = connect(&config(&url, RedisTls::default(), None))
        .await
        .expect("connect through the sentinel");
    let limited = item(name, per_minute(5));
    for _ in 0..3 {
        assert!(admitted(&store, std::slice::from_ref(&limited)).await);
    }
    // The counts are on the primary, and copied to the replica before it
    // takes over: once its link is up (its first sync can take longer than
    // WAIT's timeout on a loaded machine), WAIT sees it acknowledge them.
    eventually("the replica's link to the primary", || {
        replica
            .command(&["INFO", "replication"])
            .lines()
            .any(|l| l.trim() == "master_link_status:up")
    });
    assert_eq!(primary.query(&["WAIT", "1", "5000"]), Reply::Integer(1));
    Watched {
        primary,
        replica,
        sentinel,
        store,
        limited,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sentinel_primary_is_followed_through_a_failover_with_its_counters() {
    // The old primary stays up (kept by its name) and is demoted.
    let Watched {
        primary: _primary,
        replica,
        sentinel,
        store,
        limited,
    } = watched_by_a_sentinel("sentinel").await;

    let failover = sentinel.query(&["SENTINEL", "FAILOVER", "mymaster"]);
    assert!(!failover.is_error(), "{failover}");
    let replica_port = replica.port().to_string();
    eventually("the sentinel to name the replica", || {
        named_primary(&sentinel) == replica_port
    });
    // Calls on the old primary's connections fail (Sentinel closes them)
    // until the store has reconnected to the new one; none counts twice.
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut answers = Vec::new();
    while answers.len() < 4 {
        match store
            .apply(&Batch {
                items: vec![limited.clone()],
            })
            .await
        {
            Ok(outcome) => answers.push(outcome.admitted),
            Err(e) => {
                assert!(
                    Instant::now() < deadline,
                    "no answer after the failover: {e}"
                );
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    }
    assert_eq!(answers, [true, true, false, false], "5 in all, 3 before");
    assert_eq!(used(&store, &limited).await, 5);
    assert_eq!(
        replica
            .query(&["ROLE"])
            .items()
            .first()
            .map(Reply::to_string),
        Some("master".to_owned())
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sentinel_primary_whose_host_is_lost_is_left_for_the_promoted_replica() {
    let Watched {
        primary,
        replica,
        sentinel,
        store,
        limited,
    } = watched_by_a_sentinel("lost host").await;

    // The primary's host is lost: its process stops, so its sockets stay
    // open and nothing answers on them or closes them. The sentinel
    // promotes the replica.
    primary.pause();
    let replica_port = replica.port().to_string();
    eventually("the sentinel to promote the replica", || {
        named_primary(&sentinel) == replica_port
    });
    // The store's connection to the lost primary never breaks by itself:
    // it is replaced once its PING goes unanswered, and dialled again
    // through the sentinel. Calls until then time out (they reached a
    // Redis that never runs them).
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut answers = Vec::new();
    while answers.len() < 3 {
        let batch = Batch {
            items: vec![limited.clone()],
        };
        match store.apply(&batch).await {
            Ok(outcome) => answers.push(outcome.admitted),
            Err(e) => {
                assert!(
                    Instant::now() < deadline,
                    "no answer from the promoted replica: {e}"
                );
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
    assert_eq!(answers, [true, true, false], "5 in all, 3 before");
    assert_eq!(used(&store, &limited).await, 5);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_answered_readonly_is_dialled_again() {
    let redis = RedisServer::start();
    let other = RedisServer::start();
    let store = connect(&config(&redis.url(), RedisTls::default(), None))
        .await
        .expect("connect");
    let limited = item("demoted", per_minute(5));
    assert!(admitted(&store, std::slice::from_ref(&limited)).await);
    // A failover outside Sentinel (an operator, a Service that moves)
    // demotes this Redis; its clients stay connected and are refused.
    let other_port = other.port().to_string();
    let demoted = redis.query(&["REPLICAOF", "127.0.0.1", &other_port]);
    assert!(!demoted.is_error(), "{demoted:?}");
    // One connection of the test's own, so that its reads add none.
    let mut watch = redis.connect();
    let mut received = || {
        let info = watch.call(&["INFO", "stats"]).expect("INFO").to_string();
        info.lines()
            .find_map(|l| l.strip_prefix("total_connections_received:"))
            .map(|n| n.trim().parse::<u64>().expect("a count"))
            .expect("the connection count")
    };
    let before = received();
    let batch = Batch {
        items: vec![limited.clone()],
    };
    let refused = store.apply(&batch).await.expect_err("a replica refuses");
    assert!(
        refused.to_string().contains("read only replica"),
        "{refused}"
    );
    // The connection that answered READONLY is dialled again (here to the
    // same replica, where a moved name would find the new primary).
    eventually_async("the store to dial again", async || received() > before).await;
}

#[tokio::test]
async fn a_sentinel_that_knows_no_such_service_fails_calls_unavailable() {
    let primary = RedisServer::start();
    let sentinel = RedisServer::start_sentinel(primary.port());
    let url = format!(
        "redis-sentinel://127.0.0.1:{}/nosuchservice",
        sentinel.port()
    );
    let store = connect(&config(&url, RedisTls::default(), None))
        .await
        .expect("the store starts; calls fail until the service exists");
    let error = store
        .apply(&Batch {
            items: vec![item("x", per_minute(5))],
        })
        .await
        .expect_err("no primary to ask");
    assert!(matches!(error, StoreError::Unavailable(_)), "{error}");
    // The error says why, for whoever reads the log.
    assert!(
        error
            .to_string()
            .contains("knows no service 'nosuchservice'"),
        "{error}"
    );
    assert!(!store.is_ready());
}

// ------------------------------------------------------ per-second Redis

#[tokio::test]
async fn per_second_limits_count_in_their_own_redis_and_the_rest_in_the_main_one() {
    let (main, seconds) = (RedisServer::start(), RedisServer::start());
    let config = config(&main.url(), RedisTls::default(), Some(seconds.url()));
    let store = connect(&config).await.expect("connect");
    let fast = item("caller", per_second(1));
    let slow = item("caller-minute", per_minute(5));
    let key = |i: &BatchItem| i.identity.storage_key(&config.key_prefix);

    assert!(admitted(&store, &[fast.clone(), slow.clone()]).await);
    assert!(holds(seconds.port(), &key(&fast)) && !holds(main.port(), &key(&fast)));
    assert!(holds(main.port(), &key(&slow)) && !holds(seconds.port(), &key(&slow)));

    // Refused by the per-second Redis: what the main one counted for this
    // request is taken back, so the minute counter still says 1.
    assert!(!admitted(&store, &[fast.clone(), slow.clone()]).await);
    assert_eq!(used(&store, &slow).await, 1);
    assert_eq!(used(&store, &fast).await, 1);
}

#[tokio::test]
async fn two_redis_servers_admit_exactly_the_limit_under_concurrency() {
    let (main, seconds) = (RedisServer::start(), RedisServer::start());
    let config = config(&main.url(), RedisTls::default(), Some(seconds.url()));
    let store = Arc::new(connect(&config).await.expect("connect"));
    let fast = item("burst", per_second(5));
    let slow = item("burst-minute", per_minute(1_000));
    let calls = (0..200).map(|_| {
        let (store, items) = (store.clone(), vec![fast.clone(), slow.clone()]);
        async move { admitted(&store, &items).await }
    });
    let admitted_count = join_all(calls).await.into_iter().filter(|a| *a).count();
    assert_eq!(admitted_count, 5, "the per-second limit of 5 binds");
    // Every part the main Redis counted for a refused request was refunded.
    assert_eq!(used(&store, &slow).await, 5);
}
