//! Sluice behind a real Envoy 1.40 (`SLUICE_TEST_ENVOY`, set by `tests/run`):
//! the example front proxy `deploy/envoy/envoy.yaml` with the example rules,
//! and every Envoy snippet of the documentation (read from README.md and
//! the manual's pages, docs/src/, so the documentation is what runs): the
//! README's filter, and the manual's recipes for usage charged when the
//! stream ends, refunds, concurrency slots and the refusal access log.
//!
//! Sluice runs in process on a manual clock, so windows only move when a
//! test moves them; Envoy's calls made when a stream ends are
//! fire-and-forget, so the tests wait (`support::eventually`) until Sluice has
//! answered them before going on. Clients connect from distinct loopback
//! addresses (127.0.0.2, 127.0.0.3, …) when a test needs distinct
//! `remote_address` values.

use crate::support;

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use sluice::decision::Limiter;
use sluice::headers::HeaderMode;
use sluice::limiter::ManualClock;
use sluice::server::ServeExtras;
use sluice::store::{CounterStore, MemoryStore, MemoryStoreConfig, TimeSource};
use support::envoy::Envoy;
use support::eventually::{eventually, eventually_async};
use support::{Server, T0};
use yaml_rust2::{Yaml, YamlLoader};

fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

// ---------------------------------------------------------------------------
// YAML and the documentation's snippets
// ---------------------------------------------------------------------------

fn to_json(yaml: &Yaml) -> Value {
    match yaml {
        Yaml::Real(text) => json!(text.parse::<f64>().expect("a YAML real")),
        Yaml::Integer(n) => json!(n),
        Yaml::String(s) => json!(s),
        Yaml::Boolean(b) => json!(b),
        Yaml::Array(items) => Value::Array(items.iter().map(to_json).collect()),
        Yaml::Hash(map) => Value::Object(
            map.iter()
                .map(|(k, v)| {
                    let key = match k {
                        Yaml::String(s) => s.clone(),
                        other => format!("{other:?}"),
                    };
                    (key, to_json(v))
                })
                .collect(),
        ),
        Yaml::Null => Value::Null,
        other => panic!("unexpected YAML node {other:?}"),
    }
}

fn yaml_to_json(text: &str) -> Value {
    let docs = YamlLoader::load_from_str(text).expect("valid YAML");
    to_json(&docs[0])
}

/// README.md and the manual's pages (docs/src/*.md), with their paths.
fn doc_pages() -> Vec<(String, String)> {
    let mut paths = vec![repo().join("README.md")];
    let mut manual: Vec<_> = std::fs::read_dir(repo().join("docs/src"))
        .expect("read docs/src")
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "md"))
        .collect();
    manual.sort();
    paths.extend(manual);
    paths
        .into_iter()
        .map(|p| {
            let text = std::fs::read_to_string(&p).expect("read a page");
            (p.strip_prefix(repo()).unwrap().display().to_string(), text)
        })
        .collect()
}

/// The text of the ```yaml block right after `<!-- envoy-test: NAME -->`
/// in README.md or a page of the manual (each name on one page only).
fn readme_snippet(name: &str) -> String {
    let marker = format!("<!-- envoy-test: {name} -->");
    let pages: Vec<(String, String)> = doc_pages()
        .into_iter()
        .filter(|(_, text)| text.contains(&marker))
        .collect();
    assert_eq!(
        pages.len(),
        1,
        "the snippet {name} is on one page, not on {:?}",
        pages.iter().map(|p| &p.0).collect::<Vec<_>>()
    );
    let text = &pages[0].1;
    assert_eq!(text.matches(&marker).count(), 1, "{name} named twice");
    let at = text.find(&marker).unwrap();
    let rest = &text[at + marker.len()..];
    let start = rest
        .find("```yaml\n")
        .expect("a yaml block after the marker")
        + 8;
    let end = rest[start..].find("```").expect("the block ends");
    rest[start..start + end].to_owned()
}

// ---------------------------------------------------------------------------
// The upstream application
// ---------------------------------------------------------------------------

/// The application behind Envoy. By path:
/// - `/tokens/N`: 200 with `x-tokens: N` (the cost of the request);
/// - `/fail`: 503 with `x-refund: 1` (no work done);
/// - `/hold`: waits until the gate opens, then 200;
/// - `/echo`: 200 whose body is the request's head as it arrived (what
///   the application received from Envoy);
/// - `/login/fail`: 401 with `x-failed: 1` (a failed login);
/// - anything else: 200.
struct App {
    addr: SocketAddr,
    gate: Arc<AtomicBool>,
    held: Arc<AtomicU64>,
}

impl App {
    fn start() -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind the application");
        let addr = listener.local_addr().unwrap();
        let gate = Arc::new(AtomicBool::new(false));
        let held = Arc::new(AtomicU64::new(0));
        let (g, h) = (gate.clone(), held.clone());
        thread::spawn(move || {
            for conn in listener.incoming().flatten() {
                let (g, h) = (g.clone(), h.clone());
                thread::spawn(move || serve(conn, &g, &h));
            }
        });
        Self { addr, gate, held }
    }

    /// Lets every held request (and every later one) finish.
    fn open_gate(&self) {
        self.gate.store(true, Ordering::SeqCst);
    }

    fn close_gate(&self) {
        self.gate.store(false, Ordering::SeqCst);
    }
}

fn serve(mut conn: TcpStream, gate: &AtomicBool, held: &AtomicU64) {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 1024];
    loop {
        while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
            match conn.read(&mut chunk) {
                Ok(0) | Err(_) => return,
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
            }
        }
        let end = buf.windows(4).position(|w| w == b"\r\n\r\n").unwrap() + 4;
        let head = String::from_utf8_lossy(&buf[..end]).to_string();
        buf.drain(..end);
        let path = head.split_whitespace().nth(1).unwrap_or("/").to_owned();
        let response = if let Some(n) = path.strip_prefix("/tokens/") {
            format!("HTTP/1.1 200 OK\r\nx-tokens: {n}\r\ncontent-length: 2\r\n\r\nok")
        } else if path == "/fail" {
            "HTTP/1.1 503 Service Unavailable\r\nx-refund: 1\r\ncontent-length: 4\r\n\r\nfail"
                .to_owned()
        } else if path == "/hold" {
            held.fetch_add(1, Ordering::SeqCst);
            let deadline = Instant::now() + Duration::from_secs(60);
            while !gate.load(Ordering::SeqCst) && Instant::now() < deadline {
                thread::sleep(Duration::from_millis(5));
            }
            held.fetch_sub(1, Ordering::SeqCst);
            "HTTP/1.1 200 OK\r\ncontent-length: 4\r\n\r\nheld".to_owned()
        } else if path == "/login/fail" {
            "HTTP/1.1 401 Unauthorized\r\nx-failed: 1\r\ncontent-length: 2\r\n\r\nno".to_owned()
        } else if path == "/echo" {
            format!(
                "HTTP/1.1 200 OK\r\ncontent-length: {}\r\n\r\n{head}",
                head.len()
            )
        } else {
            "HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok".to_owned()
        };
        if conn.write_all(response.as_bytes()).is_err() {
            return;
        }
    }
}

// ---------------------------------------------------------------------------
// Envoy
// ---------------------------------------------------------------------------

/// Clusters `sluice` (gRPC, HTTP/2) and `app`, at these addresses.
fn clusters(sluice: SocketAddr, app: SocketAddr) -> Value {
    let endpoint = |name: &str, addr: SocketAddr| {
        json!({"cluster_name": name, "endpoints": [{"lb_endpoints": [{"endpoint": {"address":
            {"socket_address": {"address": "127.0.0.1", "port_value": addr.port()}}}}]}]})
    };
    json!([
        {
            "name": "sluice",
            "type": "STATIC",
            "connect_timeout": "1s",
            "typed_extension_protocol_options": {
                "envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
                    "@type": "type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions",
                    "explicit_http_config": {"http2_protocol_options": {}}
                }
            },
            "load_assignment": endpoint("sluice", sluice)
        },
        {
            "name": "app",
            "type": "STATIC",
            "connect_timeout": "1s",
            "load_assignment": endpoint("app", app)
        }
    ])
}

/// Makes Envoy's rate-limit filters in `filters` wait 5 s and fail closed:
/// on a busy machine a slow answer must not pass for an admission.
fn patient_and_closed(filters: &mut Value) {
    for filter in filters.as_array_mut().unwrap() {
        if filter["name"] == "envoy.filters.http.ratelimit" {
            filter["typed_config"]["timeout"] = json!("5s");
            filter["typed_config"]["failure_mode_deny"] = json!(true);
        }
    }
}

/// A bootstrap: one listener whose connection manager runs `filters` (then
/// the router) on one route to `app`, with `access_log` if given.
fn bootstrap(
    filters: Value,
    access_log: Option<Value>,
    sluice: SocketAddr,
    app: SocketAddr,
) -> (Value, SocketAddr, SocketAddr) {
    let (listen, admin) = (support::redis::free_port(), support::redis::free_port());
    let mut filters = filters;
    patient_and_closed(&mut filters);
    filters.as_array_mut().unwrap().push(json!({
        "name": "envoy.filters.http.router",
        "typed_config": {"@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"}
    }));
    let mut hcm = json!({
        "@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
        "stat_prefix": "front",
        "route_config": {"name": "front", "virtual_hosts": [{"name": "app", "domains": ["*"],
            "routes": [{"match": {"prefix": "/"}, "route": {"cluster": "app", "timeout": "60s"}}]}]},
        "http_filters": filters
    });
    if let Some(log) = access_log {
        hcm["access_log"] = log;
    }
    let config = json!({
        "admin": {"address": {"socket_address": {"address": "127.0.0.1", "port_value": admin}}},
        "static_resources": {
            "listeners": [{
                "name": "front",
                "address": {"socket_address": {"address": "127.0.0.1", "port_value": listen}},
                "filter_chains": [{"filters": [{
                    "name": "envoy.filters.network.http_connection_manager",
                    "typed_config": hcm
                }]}]
            }],
            "clusters": clusters(sluice, app)
        }
    });
    (
        config,
        ([127, 0, 0, 1], listen).into(),
        ([127, 0, 0, 1], admin).into(),
    )
}

// ---------------------------------------------------------------------------
// Clients and Sluice
// ---------------------------------------------------------------------------

/// A response: status, head (lowercased) and body.
#[derive(Debug)]
struct Reply {
    status: u16,
    head: String,
    body: String,
}

impl Reply {
    fn header(&self, name: &str) -> Option<&str> {
        self.head.lines().find_map(|l| {
            l.strip_prefix(name)
                .and_then(|r| r.strip_prefix(": "))
                .map(str::trim)
        })
    }
}

/// One GET through Envoy from the loopback address `127.0.0.<from>`.
fn get_from(front: SocketAddr, from: u8, path: &str, headers: &[(&str, &str)]) -> Reply {
    let socket = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
    let source: SocketAddr = ([127, 0, 0, from], 0).into();
    socket.bind(&source.into()).expect("bind a loopback source");
    socket.connect(&front.into()).expect("connect to Envoy");
    let mut conn: TcpStream = socket.into();
    conn.set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    let mut request = format!("GET {path} HTTP/1.1\r\nhost: test\r\nconnection: close\r\n");
    for (name, value) in headers {
        request.push_str(&format!("{name}: {value}\r\n"));
    }
    request.push_str("\r\n");
    conn.write_all(request.as_bytes()).unwrap();
    let mut raw = Vec::new();
    let _ = conn.read_to_end(&mut raw);
    let text = String::from_utf8_lossy(&raw).to_string();
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    Reply {
        status,
        head: head.to_lowercase(),
        body: body.to_owned(),
    }
}

fn get(front: SocketAddr, path: &str, headers: &[(&str, &str)]) -> Reply {
    get_from(front, 1, path, headers)
}

/// Sluice in process over a store (memory unless told) on a manual clock.
struct Sluice<S = MemoryStore> {
    server: Server,
    limiter: Arc<Limiter<S>>,
    clock: Arc<ManualClock>,
}

impl Sluice {
    async fn start(rules_yaml: &str, extras: ServeExtras) -> Self {
        Self::start_with_headers(rules_yaml, HeaderMode::Off, extras).await
    }

    async fn start_with_headers(
        rules_yaml: &str,
        headers: HeaderMode,
        extras: ServeExtras,
    ) -> Self {
        let clock = Arc::new(ManualClock::new(T0));
        let store = MemoryStore::new(&MemoryStoreConfig::default(), clock.clone());
        let limiter = Arc::new(Limiter::with_options(
            support::rules(rules_yaml),
            store,
            sluice::decision::LimiterOptions {
                clock: clock.clone(),
                ..Default::default()
            },
        ));
        let options = sluice::server::ServeOptions {
            headers,
            ..Default::default()
        };
        let server =
            Server::start_with_extras(limiter.clone(), options, extras, clock.clone()).await;
        Self {
            server,
            limiter,
            clock,
        }
    }
}

impl<S: CounterStore> Sluice<S> {
    /// Sluice over `store`, whose clock is `clock`, with the local
    /// over-limit cache on (as the binary runs by default).
    async fn on_store(rules_yaml: &str, store: S, clock: Arc<ManualClock>) -> Self {
        let limiter = Arc::new(Limiter::with_options(
            support::rules(rules_yaml),
            store,
            sluice::decision::LimiterOptions {
                clock: clock.clone(),
                local_cache: 10_000,
                ..Default::default()
            },
        ));
        let server = Server::start_with_extras(
            limiter.clone(),
            Default::default(),
            ServeExtras::default(),
            clock.clone(),
        )
        .await;
        Self {
            server,
            limiter,
            clock,
        }
    }

    /// Decisions answered so far, by code.
    fn answered(&self) -> HashMap<String, u64> {
        let text = self.limiter.metrics().encode();
        text.lines()
            .filter_map(|l| l.strip_prefix("sluice_requests_total{code=\""))
            .filter_map(|l| l.split_once("\"} "))
            .map(|(code, n)| (code.to_owned(), n.trim().parse().unwrap()))
            .collect()
    }

    fn answered_total(&self) -> u64 {
        self.answered().values().sum()
    }

    /// Waits until Sluice has answered `n` decisions in all.
    fn wait_answered(&self, n: u64) {
        let got = eventually(&format!("Sluice to answer {n} decisions"), || {
            let got = self.answered_total();
            (got >= n)
                .then_some(got)
                .ok_or(format!("{got}: {:?}", self.answered()))
        });
        assert_eq!(
            got,
            n,
            "more decisions than expected: {:?}",
            self.answered()
        );
    }

    fn addr(&self) -> SocketAddr {
        self.server.grpc
    }
}

/// Runs blocking client code off the runtime.
async fn blocking<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    tokio::task::spawn_blocking(f).await.unwrap()
}

/// The documentation's snippet `NAME/filters` as a list of HTTP filters.
fn snippet_filters(name: &str) -> Value {
    let filters = yaml_to_json(&readme_snippet(&format!("{name}/filters")));
    assert!(filters.is_array(), "{name}/filters is a list of filters");
    filters
}

// ---------------------------------------------------------------------------
// The example front proxy
// ---------------------------------------------------------------------------

/// deploy/envoy/envoy.yaml with its addresses moved to free loopback ports,
/// Sluice's and the application's given, an access log naming the refusing
/// limit (the manual's snippet), and the rate-limit filter patient and
/// failing closed.
fn example_front_proxy(sluice: SocketAddr, app: SocketAddr) -> (Value, SocketAddr, SocketAddr) {
    let text = std::fs::read_to_string(repo().join("deploy/envoy/envoy.yaml")).unwrap();
    let mut config = yaml_to_json(&text);
    let (listen, admin) = (support::redis::free_port(), support::redis::free_port());
    config["admin"]["address"]["socket_address"]["port_value"] = json!(admin);
    let access_log = yaml_to_json(&readme_snippet("explain/access_log"))["access_log"].clone();
    for listener in config["static_resources"]["listeners"]
        .as_array_mut()
        .unwrap()
    {
        listener["address"]["socket_address"] =
            json!({"address": "127.0.0.1", "port_value": listen});
        for chain in listener["filter_chains"].as_array_mut().unwrap() {
            for filter in chain["filters"].as_array_mut().unwrap() {
                let hcm = &mut filter["typed_config"];
                hcm["access_log"] = access_log.clone();
                patient_and_closed(&mut hcm["http_filters"]);
            }
        }
    }
    support::envoy::route_clusters(&mut config, sluice, app);
    (
        config,
        ([127, 0, 0, 1], listen).into(),
        ([127, 0, 0, 1], admin).into(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_example_configs_limits_hold_through_envoy() {
    let rules = std::fs::read_to_string(repo().join("examples/rules.yaml")).unwrap();
    let sluice = Sluice::start(
        &rules,
        ServeExtras {
            problem_body: true,
            ..Default::default()
        },
    )
    .await;
    let app = App::start();
    let (config, front, admin) = example_front_proxy(sluice.addr(), app.addr);
    let envoy = Envoy::start(&config, front, admin);
    let clock = sluice.clock.clone();

    let envoy = blocking(move || {
        // remote_address: 10 per minute per client address.
        for i in 0..10 {
            let r = get_from(front, 2, "/", &[]);
            assert_eq!(r.status, 200, "request {i}: {r:?}");
        }
        let r = get_from(front, 2, "/", &[]);
        assert_eq!(r.status, 429, "{r:?}");
        assert_eq!(r.header("x-envoy-ratelimited"), Some("true"), "{r:?}");
        assert_eq!(r.header("content-type"), Some("application/problem+json"));
        let body: Value = serde_json::from_str(&r.body).expect("a problem document");
        assert_eq!(body["limit"], "per-address", "{body}");
        assert_eq!(body["descriptor"], "remote_address=127.0.0.2", "{body}");
        assert!(
            r.header("x-ratelimit-reset")
                .unwrap()
                .parse::<u64>()
                .unwrap()
                >= 1,
            "a 429 never says reset 0: {r:?}"
        );
        // Another address has its own budget.
        assert_eq!(get_from(front, 3, "/", &[]).status, 200);

        // api_key: one per 2 seconds (and 20 a minute).
        let key = [("x-api-key", "k1")];
        let r = get_from(front, 4, "/", &key);
        assert_eq!(r.status, 200, "{r:?}");
        // Envoy's own headers cannot name the 2 s window (the manual says so).
        let limit = r.header("x-ratelimit-limit").unwrap();
        assert!(
            !limit.contains("w=2;") && !limit.contains("min-gap"),
            "{limit}"
        );
        let r = get_from(front, 4, "/", &key);
        assert_eq!(r.status, 429, "{r:?}");
        let body: Value = serde_json::from_str(&r.body).unwrap();
        assert_eq!(
            (body["limit"].as_str(), body["window"].as_str()),
            (Some("min-gap"), Some("2s"))
        );
        clock.advance(2_000);
        assert_eq!(get_from(front, 4, "/", &key).status, 200);
        // 20 a minute binds too: 18 more, 2 s apart, from other addresses.
        for i in 0..18u8 {
            clock.advance(2_000);
            let r = get_from(front, 10 + i / 9, "/", &key);
            assert_eq!(r.status, 200, "api_key request {i}: {r:?}");
        }
        clock.advance(2_000);
        let r = get_from(front, 12, "/", &key);
        assert_eq!(r.status, 429, "the 21st in a minute: {r:?}");
        let body: Value = serde_json::from_str(&r.body).unwrap();
        assert_eq!(body["limit"], "per-minute", "{body}");

        // tenant: token bucket, 5/s, bursts of 20; Envoy's headers never say
        // more than 5 remain, and a refusal never says reset 0.
        for i in 0..20 {
            let r = get_from(front, 20 + i / 8, "/", &[("x-tenant", "acme")]);
            assert_eq!(r.status, 200, "tenant request {i}: {r:?}");
            let remaining: u64 = r.header("x-ratelimit-remaining").unwrap().parse().unwrap();
            assert!(
                remaining <= 5,
                "remaining {remaining} above the limit of 5: {r:?}"
            );
        }
        let r = get_from(front, 23, "/", &[("x-tenant", "acme")]);
        assert_eq!(r.status, 429, "{r:?}");
        assert_eq!(r.header("x-ratelimit-reset"), Some("1"), "{r:?}");

        // user + path: 20 per 5 minutes, whatever the query string says.
        for i in 0..20u8 {
            let path = format!("/report?page={i}");
            let r = get_from(front, 30 + i / 8, &path, &[("x-user", "alice")]);
            assert_eq!(r.status, 200, "user request {i}: {r:?}");
        }
        let r = get_from(front, 33, "/report?page=new", &[("x-user", "alice")]);
        assert_eq!(r.status, 429, "a new query string is the same path: {r:?}");
        // A client cannot choose its own path counter either.
        let r = get_from(
            front,
            33,
            "/report",
            &[("x-user", "alice"), ("x-sluice-path", "/elsewhere")],
        );
        assert_eq!(r.status, 429, "{r:?}");
        assert_eq!(
            get_from(front, 33, "/other", &[("x-user", "alice")]).status,
            200
        );

        // /static/: one counter for every file, 50 per second.
        for i in 0..50u8 {
            let path = format!("/static/file{i}.css?v={i}");
            assert_eq!(
                get_from(front, 40 + i / 8, &path, &[]).status,
                200,
                "static {i}"
            );
        }
        let r = get_from(front, 47, "/static/other.js", &[]);
        assert_eq!(r.status, 429, "{r:?}");

        // plan: trial is shadow mode (never refused), enterprise unlimited.
        for i in 0..8u8 {
            let r = get_from(front, 50, "/", &[("x-plan", "trial")]);
            assert_eq!(r.status, 200, "trial {i} (limit 5, shadow mode): {r:?}");
        }
        for i in 0..2u8 {
            let r = get_from(front, 51, "/", &[("x-plan", "enterprise")]);
            assert_eq!(r.status, 200, "enterprise {i}: {r:?}");
        }
        envoy
    })
    .await;

    // Envoy's statistics agree with Sluice's: one decision per request.
    let answered = sluice.answered();
    let (ok, over) = (
        answered.get("OK").copied().unwrap_or(0),
        answered.get("OVER_LIMIT").copied().unwrap_or(0),
    );
    for code in ["UNAVAILABLE", "INVALID_ARGUMENT"] {
        assert_eq!(answered.get(code).copied().unwrap_or(0), 0, "{answered:?}");
    }
    let envoy = blocking(move || {
        let what = format!("Envoy to count Sluice's OK {ok}, OVER_LIMIT {over}");
        eventually(&what, || {
            let (e_ok, e_over) = (
                envoy.stat("cluster.app.ratelimit.ok"),
                envoy.stat("cluster.app.ratelimit.over_limit"),
            );
            ((e_ok, e_over) == (ok, over))
                .then_some(())
                .ok_or(format!("Envoy counted ok {e_ok}, over_limit {e_over}"))
        });
        assert_eq!(envoy.stat("cluster.app.ratelimit.error"), 0);
        envoy
    })
    .await;
    assert_eq!(over, 7, "the test made 7 refusals: {answered:?}");

    // The access log names the limit and window of each refusal.
    let log = envoy.log.clone();
    let lines = eventually_async("a log line for each refusal", async || {
        let lines = log.lock().unwrap().clone();
        let refused = lines.iter().filter(|l| l.starts_with("429")).count();
        if refused as u64 == over {
            Ok(lines)
        } else {
            Err(format!("access log: {lines:?}"))
        }
    })
    .await;
    assert!(
        lines.contains(&"429 per-address 60s".to_owned()),
        "{lines:?}"
    );
    assert!(lines.contains(&"429 min-gap 2s".to_owned()), "{lines:?}");
    assert!(lines.iter().any(|l| l.starts_with("200 - -")), "{lines:?}");
    drop(envoy);
    sluice.server.stop().await;
}

/// The smallest filter, as the README and the manual's Envoy page show it
/// (one `remote_address` descriptor, domain `example`): the example rules'
/// 10 per minute per client address hold through Envoy.
async fn the_smallest_filter_limits_each_address(filters: Value) {
    let rules = std::fs::read_to_string(repo().join("examples/rules.yaml")).unwrap();
    let sluice = Sluice::start(&rules, ServeExtras::default()).await;
    let app = App::start();
    let (config, front, admin) = bootstrap(filters, None, sluice.addr(), app.addr);
    let envoy = Envoy::start(&config, front, admin);
    blocking(move || {
        for i in 0..10 {
            let r = get_from(front, 2, "/", &[]);
            assert_eq!(r.status, 200, "request {i}: {r:?}");
        }
        let r = get_from(front, 2, "/", &[]);
        assert_eq!(r.status, 429, "the 11th in a minute: {r:?}");
        // Another address has its own budget.
        assert_eq!(get_from(front, 3, "/", &[]).status, 200);
        drop(envoy);
    })
    .await;
    let answered = sluice.answered();
    assert_eq!(
        (
            answered.get("OK").copied(),
            answered.get("OVER_LIMIT").copied()
        ),
        (Some(11), Some(1)),
        "one decision per request: {answered:?}"
    );
    sluice.server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_readmes_filter_limits_each_client_address_through_envoy() {
    the_smallest_filter_limits_each_address(snippet_filters("quickstart")).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_manuals_smallest_filter_limits_each_client_address_through_envoy() {
    the_smallest_filter_limits_each_address(snippet_filters("manual")).await;
}

// ---------------------------------------------------------------------------
// Usage, refunds, concurrency (the manual's snippets)
// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn usage_is_checked_on_the_request_and_charged_when_the_stream_ends() {
    let sluice = Sluice::start(&readme_snippet("usage/rules"), ServeExtras::default()).await;
    let app = App::start();
    let (config, front, admin) = bootstrap(snippet_filters("usage"), None, sluice.addr(), app.addr);
    let envoy = Envoy::start(&config, front, admin);
    let sluice = Arc::new(sluice);
    let s = sluice.clone();
    blocking(move || {
        let user = [("x-user", "u1")];
        // 2 tokens a minute, each response costs 1: the check (weight 0)
        // passes while at most 2 are spent, so three pass.
        for i in 0..3u64 {
            let r = get(front, "/tokens/1", &user);
            assert_eq!(r.status, 200, "request {i}: {r:?}");
            // The check, then the charge when the stream ended.
            s.wait_answered(2 * (i + 1));
        }
        let r = get(front, "/tokens/1", &user);
        assert_eq!(r.status, 429, "the 4th request: {r:?}");
        // A refused request is not charged (no x-tokens): only its check.
        s.wait_answered(7);
        // Another user is untouched.
        assert_eq!(get(front, "/tokens/1", &[("x-user", "u2")]).status, 200);
        // Once the window has slid past the charges (a minute plus the 6 s
        // bucket they fell in), the budget is back.
        s.clock.advance(66_000);
        s.wait_answered(9);
        assert_eq!(get(front, "/tokens/1", &user).status, 200);
        drop(envoy);
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refund_gives_the_charge_back_when_the_stream_ends() {
    let sluice = Sluice::start(&readme_snippet("refund/rules"), ServeExtras::default()).await;
    let app = App::start();
    let (config, front, admin) =
        bootstrap(snippet_filters("refund"), None, sluice.addr(), app.addr);
    let envoy = Envoy::start(&config, front, admin);
    let sluice = Arc::new(sluice);
    let s = sluice.clone();
    blocking(move || {
        let user = [("x-user", "u1")];
        // 2 a minute, but failed requests are refunded: five of them pass.
        let mut answered = 0;
        for i in 0..5 {
            let r = get(front, "/fail", &user);
            assert_eq!(
                r.status, 503,
                "failed request {i} reaches the application: {r:?}"
            );
            answered += 2;
            s.wait_answered(answered);
        }
        let answered_codes = s.answered();
        assert_eq!(
            answered_codes.get("INVALID_ARGUMENT").copied().unwrap_or(0),
            0,
            "Sluice refused the refunds: {answered_codes:?}"
        );
        for i in 0..2 {
            assert_eq!(get(front, "/", &user).status, 200, "request {i}");
        }
        let r = get(front, "/", &user);
        assert_eq!(r.status, 429, "{r:?}");
        drop(envoy);
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrency_slots_are_taken_released_and_leased() {
    let sluice = Sluice::start(&readme_snippet("concurrency/rules"), ServeExtras::default()).await;
    let app = Arc::new(App::start());
    let (config, front, admin) = bootstrap(
        snippet_filters("concurrency"),
        None,
        sluice.addr(),
        app.addr,
    );
    let envoy = Envoy::start(&config, front, admin);
    let sluice = Arc::new(sluice);
    let (s, a) = (sluice.clone(), app.clone());
    blocking(move || {
        let user = [("x-user", "u1")];
        let hold = |n: usize| -> Vec<thread::JoinHandle<Reply>> {
            (0..n)
                .map(|_| thread::spawn(move || get(front, "/hold", &[("x-user", "u1")])))
                .collect()
        };
        let wait_held = |n: u64| {
            eventually(&format!("{n} requests held"), || {
                let held = a.held.load(Ordering::SeqCst);
                (held == n).then_some(()).ok_or(format!("{held} held"))
            })
        };

        // Three requests held open by a slow application take the 3 slots.
        let held = hold(3);
        wait_held(3);
        s.wait_answered(3);
        let r = get(front, "/", &user);
        assert_eq!(r.status, 429, "the 4th in flight: {r:?}");
        // Its stream ended; it took no slot and gives none back.
        s.wait_answered(5);
        assert_eq!(get(front, "/", &user).status, 429, "still 3 in flight");
        s.wait_answered(7);

        // The streams end: their slots come back.
        a.open_gate();
        for h in held {
            assert_eq!(h.join().unwrap().status, 200);
        }
        s.wait_answered(10);
        a.close_gate();
        let held = hold(3);
        wait_held(3);
        s.wait_answered(13);
        assert_eq!(get(front, "/", &user).status, 429);
        s.wait_answered(15);

        // Envoy dies with 3 requests in flight: their releases are lost.
        drop(envoy);
        for h in held {
            let _ = h.join();
        }
        let envoy = Envoy::start(&config, front, admin);
        assert_eq!(
            get(front, "/", &user).status,
            429,
            "the lost slots still count"
        );
        s.wait_answered(17);
        // Their leases (30 s) end; the slots come back.
        s.clock.advance(30_001);
        assert_eq!(get(front, "/", &user).status, 200);
        drop(envoy);
        a.open_gate();
    })
    .await;
}

/// One limit of 2 per plan, for every algorithm and a calendar period
/// (Sluice's clock, T0, is 23:00 in Paris: the day ends in an hour).
const RETRY_RULES: &str = r#"
domain: api
descriptors:
  - {key: plan, value: sliding, rate_limit: {unit: minute, requests_per_unit: 2}}
  - {key: plan, value: fixed, rate_limit: {unit: minute, requests_per_unit: 2, algorithm: fixed_window}}
  - {key: plan, value: bucket, rate_limit: {unit: minute, requests_per_unit: 2, algorithm: token_bucket}}
  - {key: plan, value: log, rate_limit: {unit: minute, requests_per_unit: 2, algorithm: sliding_log}}
  - {key: plan, value: slots, rate_limit: {algorithm: concurrency, requests_per_unit: 2, lease: 45s}}
  - {key: plan, value: daily, rate_limit: {unit: day, requests_per_unit: 2, calendar: Europe/Paris}}
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_retrying_exactly_after_retry_after_is_admitted_for_every_algorithm() {
    let sluice = Sluice::start(RETRY_RULES, ServeExtras::default()).await;
    let app = Arc::new(App::start());
    let (config, front, admin) = bootstrap(snippet_filters("retry"), None, sluice.addr(), app.addr);
    let envoy = Envoy::start(&config, front, admin);
    let sluice = Arc::new(sluice);
    let s = sluice.clone();
    blocking(move || {
        let mut answered = 0;
        // (plan, the longest Retry-After it may give: its window or lease,
        // and for the sliding window one more bucket, 6 s)
        for (plan, longest) in [
            ("sliding", 66),
            ("fixed", 60),
            ("bucket", 60),
            ("log", 60),
            ("slots", 45),
            ("daily", 3_600),
        ] {
            let headers = [("x-plan", plan)];
            for _ in 0..2 {
                assert_eq!(get(front, "/", &headers).status, 200, "{plan}");
            }
            let refused = get(front, "/", &headers);
            answered += 3;
            s.wait_answered(answered);
            assert_eq!(refused.status, 429, "{plan}: {refused:?}");
            let after: u64 = refused
                .header("retry-after")
                .unwrap_or_else(|| panic!("{plan}: no Retry-After: {refused:?}"))
                .parse()
                .expect("whole seconds");
            assert!(
                (1..=longest).contains(&after),
                "{plan}: Retry-After {after}"
            );
            // Waiting exactly that long is enough.
            s.clock.advance(after * 1_000);
            let retried = get(front, "/", &headers);
            answered += 1;
            s.wait_answered(answered);
            assert_eq!(retried.status, 200, "{plan} after {after} s: {retried:?}");
        }
        drop(envoy);
    })
    .await;
}

/// The manual's penalty box on a real Redis (the script on the manual
/// clock): failures counted when the 401 reaches Envoy, the sixth in a
/// minute blocks for 15 minutes, blocked requests are refused with the
/// block's time as Retry-After and answered without a script call, waiting
/// exactly Retry-After is enough, and the next offence doubles the block.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failed_logins_counted_on_the_response_block_and_escalate_without_calling_redis() {
    let redis = support::redis::RedisServer::start();
    let clock = Arc::new(ManualClock::new(T0));
    let timeout = Duration::from_secs(5);
    let store = support::redis_store(&redis.url(), clock.clone(), TimeSource::Local, timeout).await;
    let sluice = Sluice::on_store(&readme_snippet("penalty/rules"), store, clock).await;
    let app = App::start();
    let (config, front, admin) =
        bootstrap(snippet_filters("penalty"), None, sluice.addr(), app.addr);
    let envoy = Envoy::start(&config, front, admin);
    let (sluice, port) = (Arc::new(sluice), redis.port());
    let s = sluice.clone();
    blocking(move || {
        let mut answered = 0;
        let mut expect = |user: &str, path: &str, status: u16, decisions: u64| {
            let r = get(front, path, &[("x-user", user)]);
            answered += decisions;
            s.wait_answered(answered);
            assert_eq!(r.status, status, "{user} {path}: {r:?}");
            r
        };
        for (block, round) in [(900, "first"), (1_800, "second")] {
            // Five failures fit: each a check, then a charge.
            for _ in 0..5 {
                expect("mallory", "/login/fail", 401, 2);
            }
            // A success charges nothing (no x-failed).
            expect("mallory", "/login/ok", 200, 1);
            // The sixth failure's check passes; its charge is the offence.
            expect("mallory", "/login/fail", 401, 2);
            let scripts = support::redis::command_calls(port, "evalsha");
            for _ in 0..3 {
                let r = expect("mallory", "/login/ok", 429, 1);
                assert_eq!(
                    r.header("retry-after"),
                    Some(&*block.to_string()),
                    "{round}"
                );
            }
            assert_eq!(
                support::redis::command_calls(port, "evalsha"),
                scripts,
                "{round} block: answered without calling Redis"
            );
            expect("alice", "/login/ok", 200, 1);
            s.clock.advance(block * 1_000 - 1_000);
            expect("mallory", "/login/ok", 429, 1);
            s.clock.advance(1_000);
            expect("mallory", "/login/ok", 200, 1);
        }
        drop(envoy);
    })
    .await;
}

// ---------------------------------------------------------------------------
// Warnings before the wall (the manual's snippets)
// ---------------------------------------------------------------------------

/// The values of header `name` in a request head as the application
/// received it (an `/echo` body).
fn received(head: &str, name: &str) -> Vec<String> {
    head.lines()
        .filter_map(|l| l.split_once(':'))
        .filter(|(n, _)| n.trim().eq_ignore_ascii_case(name))
        .map(|(_, v)| v.trim().to_owned())
        .collect()
}

/// The manual's warnings recipe through Envoy: 5 a minute, warned past
/// 0.6 of it. The client, which also tries to hand the application
/// headroom headers of its own, sees `x-ratelimit-soft-breach: 1` on the
/// 4th and 5th requests only (not on the 429); the application receives
/// Sluice's `x-ratelimit-remaining` and `x-ratelimit-name` when
/// `upstream_headroom_headers` is on, and none of either when off.
async fn warnings_through_envoy(upstream_headroom: bool) {
    let sluice = Sluice::start(
        &readme_snippet("warnings/rules"),
        ServeExtras {
            upstream_headroom,
            ..Default::default()
        },
    )
    .await;
    let app = App::start();
    let (config, front, admin) =
        bootstrap(snippet_filters("warnings"), None, sluice.addr(), app.addr);
    let envoy = Envoy::start(&config, front, admin);
    blocking(move || {
        let headers = [
            ("x-user", "u1"),
            ("x-ratelimit-remaining", "1000"),
            ("x-ratelimit-name", "forged"),
        ];
        for i in 1..=5u64 {
            let r = get(front, "/echo", &headers);
            assert_eq!(r.status, 200, "request {i}: {r:?}");
            let expected = (i > 3).then_some("1");
            assert_eq!(
                r.header("x-ratelimit-soft-breach"),
                expected,
                "request {i}, 0.6 of 5 is 3: {r:?}"
            );
            let (remaining, name) = (
                received(&r.body, "x-ratelimit-remaining"),
                received(&r.body, "x-ratelimit-name"),
            );
            if upstream_headroom {
                assert_eq!(remaining, [(5 - i).to_string()], "request {i}: {r:?}");
                assert_eq!(name, ["per-user"], "request {i}: {r:?}");
            } else {
                assert!(
                    remaining.is_empty() && name.is_empty(),
                    "request {i}: {r:?}"
                );
            }
        }
        let r = get(front, "/echo", &headers);
        assert_eq!(r.status, 429, "the 6th in a minute: {r:?}");
        assert_eq!(r.header("x-ratelimit-soft-breach"), None, "{r:?}");
        // Another user is far from the wall.
        let r = get(front, "/echo", &[("x-user", "u2")]);
        assert_eq!((r.status, r.header("x-ratelimit-soft-breach")), (200, None));
        drop(envoy);
    })
    .await;
    sluice.server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_client_is_warned_past_the_soft_ratio_and_the_upstream_told_its_headroom() {
    warnings_through_envoy(true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_upstream_headroom_headers_the_upstream_is_told_nothing() {
    warnings_through_envoy(false).await;
}

/// Why the manual's snippet removes the client's headroom headers: Envoy
/// adds `request_headers_to_add` beside a header of the same name, so the
/// application would receive the client's value too (first).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn envoy_adds_the_headroom_beside_a_header_the_client_sent() {
    let sluice = Sluice::start(
        &readme_snippet("warnings/rules"),
        ServeExtras {
            upstream_headroom: true,
            ..Default::default()
        },
    )
    .await;
    let app = App::start();
    let mut filters = snippet_filters("warnings");
    filters
        .as_array_mut()
        .unwrap()
        .retain(|f| f["name"] != "envoy.filters.http.header_mutation");
    let (config, front, admin) = bootstrap(filters, None, sluice.addr(), app.addr);
    let envoy = Envoy::start(&config, front, admin);
    let r = blocking(move || {
        let r = get(
            front,
            "/echo",
            &[("x-user", "u1"), ("x-ratelimit-remaining", "1000")],
        );
        drop(envoy);
        r
    })
    .await;
    assert_eq!(r.status, 200, "{r:?}");
    assert_eq!(received(&r.body, "x-ratelimit-remaining"), ["1000", "4"]);
    sluice.server.stop().await;
}

#[test]
fn every_envoy_snippet_of_the_docs_is_run_by_a_test() {
    let this = std::fs::read_to_string(repo().join("tests/envoy/rls.rs")).unwrap();
    let mut names = Vec::new();
    for (page, text) in doc_pages() {
        // A marker is a line of its own (a page may name the convention
        // inline).
        let markers = text.lines().filter_map(|l| {
            l.trim()
                .strip_prefix("<!-- envoy-test: ")
                .and_then(|l| l.strip_suffix(" -->"))
        });
        for name in markers {
            names.push(name.to_owned());
            let used = format!("readme_snippet(\"{name}\")");
            let group = name.split('/').next().unwrap();
            assert!(
                this.contains(&used)
                    || (name.ends_with("/filters")
                        && this.contains(&format!("snippet_filters(\"{group}\")"))),
                "{page}: the snippet {name} is not run by tests/envoy/rls.rs"
            );
        }
    }
    assert!(names.len() >= 9, "{names:?}");
    assert!(names.iter().any(|n| n == "quickstart/filters"), "{names:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sluices_own_headers_name_every_window_through_envoy() {
    // The README's alternative: Envoy's headers off, Sluice's draft03 on.
    let rules = std::fs::read_to_string(repo().join("examples/rules.yaml")).unwrap();
    let sluice =
        Sluice::start_with_headers(&rules, HeaderMode::Draft03, ServeExtras::default()).await;
    let app = App::start();
    let (mut config, front, admin) = example_front_proxy(sluice.addr(), app.addr);
    for listener in config["static_resources"]["listeners"]
        .as_array_mut()
        .unwrap()
    {
        for chain in listener["filter_chains"].as_array_mut().unwrap() {
            for filter in chain["filters"].as_array_mut().unwrap() {
                for http in filter["typed_config"]["http_filters"]
                    .as_array_mut()
                    .unwrap()
                {
                    if let Some(config) = http["typed_config"].as_object_mut() {
                        config.remove("enable_x_ratelimit_headers");
                    }
                }
            }
        }
    }
    let envoy = Envoy::start(&config, front, admin);
    let r = blocking(move || {
        let headers = [("x-api-key", "k1"), ("x-user", "alice")];
        let r = get_from(front, 2, "/report", &headers);
        drop(envoy);
        r
    })
    .await;
    assert_eq!(r.status, 200, "{r:?}");
    let limits: Vec<&str> = r
        .head
        .lines()
        .filter_map(|l| l.strip_prefix("x-ratelimit-limit: "))
        .collect();
    assert_eq!(limits.len(), 1, "one set of headers, Sluice's: {r:?}");
    for window in ["w=60;name=\"per-address\"", "w=2;name=\"min-gap\"", "w=300"] {
        assert!(
            limits[0].contains(window),
            "{window} missing: {}",
            limits[0]
        );
    }
    sluice.server.stop().await;
}
