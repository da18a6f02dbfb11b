//! The operations kit of deploy/observability/: the alerts pass `promtool`
//! (syntax and their unit tests), the PrometheusRule of the monitoring
//! component carries exactly alerts.yaml, the dashboard picks its data
//! source from a variable, and a real Prometheus (Debian's `prometheus`,
//! which `tests/run` installs) scraping a Sluice under load (decisions on
//! `/json`, and one RLQS stream as Envoy holds it), on the memory store and
//! on Redis, returns data for every expression of the dashboard and of the
//! alerts.

use super::*;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_service_client::RateLimitQuotaServiceClient;
use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_usage_reports::BucketQuotaUsage;
use envoy_types::pb::envoy::service::rate_limit_quota::v3::{
    BucketId, RateLimitQuotaResponse, RateLimitQuotaUsageReports,
};
use envoy_types::pb::google::protobuf::Duration as PbDuration;

/// How long Prometheus may take to start and to have scraped enough for
/// every expression (scrapes are 1 s apart; a rate needs two).
const PATIENCE: Duration = Duration::from_secs(90);

/// What `$__rate_interval` and `$__range` stand for in the queries here.
const RATE_INTERVAL: &str = "1m";

fn observability(rel: &str) -> PathBuf {
    deploy("observability").join(rel)
}

/// A program of Debian's `prometheus` package, which `tests/run` installs.
fn prometheus_tool(name: &str) -> Command {
    let found = Command::new(name)
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    assert!(
        found,
        "{name} is not installed: `apt-get install prometheus` (tests/run does)"
    );
    Command::new(name)
}

fn run_ok(command: &mut Command) -> String {
    let out = command.output().expect("run the command");
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{command:?} failed:\n{text}");
    text
}

#[test]
fn promtool_checks_the_alerts_and_runs_their_unit_tests() {
    let alerts = observability("alerts.yaml");
    let text = run_ok(
        prometheus_tool("promtool")
            .args(["check", "rules"])
            .arg(&alerts),
    );
    assert!(text.contains("SUCCESS"), "{text}");
    // Every alert has a case in alerts.test.yaml, and every annotation an
    // operator needs.
    let tests = read(&observability("alerts.test.yaml"));
    for rule in alert_rules() {
        let name = s(&rule["alert"], "alert");
        assert!(
            tests.contains(&format!("alertname: {name}\n")),
            "alerts.test.yaml has no case for {name}"
        );
        for annotation in ["summary", "description", "runbook"] {
            assert!(
                rule["annotations"][annotation].is_string(),
                "{name} has no {annotation}"
            );
        }
    }
    let text = run_ok(
        prometheus_tool("promtool")
            .args(["test", "rules"])
            .arg(observability("alerts.test.yaml")),
    );
    assert!(text.contains("SUCCESS"), "{text}");
}

/// Every alerting rule of alerts.yaml.
fn alert_rules() -> Vec<Value> {
    let alerts = &yaml_file(&observability("alerts.yaml"))[0];
    let rules: Vec<Value> = list(&alerts["groups"])
        .iter()
        .flat_map(|g| list(&g["rules"]).to_vec())
        .collect();
    assert!(rules.len() >= 9, "{rules:?}");
    rules
}

#[test]
fn the_monitoring_component_ships_alerts_yaml_as_a_prometheus_rule() {
    let alerts = &yaml_file(&observability("alerts.yaml"))[0];
    let component = deploy("kubernetes/components/monitoring");
    let rule = yaml_file(&component.join("prometheusrule.yaml"));
    let rule = find(&rule, "PrometheusRule", "sluice").expect("a PrometheusRule");
    assert_eq!(
        &rule["spec"], alerts,
        "prometheusrule.yaml's spec differs from deploy/observability/alerts.yaml: copy its groups"
    );
    let kustomization = &yaml_file(&component.join("kustomization.yaml"))[0];
    assert!(
        list(&kustomization["resources"]).contains(&json!("prometheusrule.yaml")),
        "the component does not list prometheusrule.yaml"
    );
    // The RLQS series are scraped too (the RLQS alerts need them).
    let monitor = &yaml_file(&component.join("podmonitor.yaml"))[0];
    let paths: Vec<&Value> = list(&monitor["spec"]["podMetricsEndpoints"])
        .iter()
        .map(|e| &e["path"])
        .collect();
    assert_eq!(paths, [&json!("/metrics"), &json!("/metrics/rlqs")]);
}

/// The dashboard: one `datasource` variable of Prometheus data sources,
/// every panel and query using it, and no other data-source UID.
fn dashboard() -> Value {
    serde_json::from_str(&read(&observability("dashboard.json"))).expect("dashboard.json is JSON")
}

/// Every panel of the dashboard that queries, rows' nested panels included.
fn dashboard_panels(dashboard: &Value) -> Vec<Value> {
    let mut out = Vec::new();
    for panel in list(&dashboard["panels"]) {
        out.extend(list(&panel["panels"]).iter().cloned());
        if panel["type"] != "row" {
            out.push(panel.clone());
        }
    }
    out
}

/// Every query of the dashboard, its template variables replaced.
fn dashboard_queries() -> Vec<(String, String)> {
    let dashboard = dashboard();
    let mut out = Vec::new();
    for panel in dashboard_panels(&dashboard) {
        for target in list(&panel["targets"]) {
            let expr = s(&target["expr"], "a target's expr")
                .replace("$__rate_interval", RATE_INTERVAL)
                .replace("$__range", RATE_INTERVAL);
            assert!(!expr.contains('$'), "unknown variable in {expr}");
            out.push((s(&panel["title"], "a title").to_owned(), expr));
        }
    }
    out
}

#[test]
fn the_dashboard_takes_its_data_source_from_a_variable() {
    let dashboard = dashboard();
    let variables = list(&dashboard["templating"]["list"]);
    let source = variables
        .iter()
        .find(|v| v["name"] == "datasource")
        .expect("a datasource variable");
    assert_eq!(
        (&source["type"], &source["query"]),
        (&json!("datasource"), &json!("prometheus"))
    );
    let panels = dashboard_panels(&dashboard);
    assert!(panels.len() >= 12, "{} panels", panels.len());
    let wanted = json!({"type": "prometheus", "uid": "${datasource}"});
    for panel in &panels {
        assert_eq!(panel["datasource"], wanted, "{}", panel["title"]);
        assert!(!list(&panel["targets"]).is_empty(), "{}", panel["title"]);
        for target in list(&panel["targets"]) {
            assert_eq!(target["datasource"], wanted, "{}", panel["title"]);
        }
    }
    // No UID anywhere but the variable's: a dashboard importable anywhere.
    let text = read(&observability("dashboard.json"));
    assert_eq!(
        text.matches("\"uid\"").count(),
        text.matches("\"uid\": \"${datasource}\"").count(),
        "a hard-coded UID"
    );
    assert!(
        dashboard.get("uid").is_none() && dashboard.get("id").is_none(),
        "the dashboard must not carry its own uid or id"
    );
}

// ---------------------------------------------------------------------------
// A real Prometheus
// ---------------------------------------------------------------------------

const LOAD_RULES: &str = "\
domain: obs
descriptors:
  - key: client
    rate_limit: {unit: second, requests_per_unit: 5, name: per-client}
  - key: trial
    shadow_mode: true
    rate_limit: {unit: minute, requests_per_unit: 1}
";

/// A loopback port nobody listens on now.
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Percent-encodes a query-string value.
fn encode(value: &str) -> String {
    value
        .bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// Prometheus scraping Sluice's admin port `target` (both metric paths)
/// every second, with alerts.yaml loaded.
struct Prometheus {
    _process: Process,
    addr: SocketAddr,
    _dir: tempfile::TempDir,
}

impl Prometheus {
    fn start(target: SocketAddr) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let config = dir.path().join("prometheus.yml");
        std::fs::write(
            &config,
            format!(
                "global: {{scrape_interval: 1s, evaluation_interval: 1s}}\n\
                 rule_files: [{alerts}]\n\
                 scrape_configs:\n\
                 - job_name: sluice\n  static_configs: [{{targets: ['{target}']}}]\n\
                 - job_name: sluice-rlqs\n  metrics_path: /metrics/rlqs\n  static_configs: [{{targets: ['{target}']}}]\n",
                alerts = observability("alerts.yaml").display()
            ),
        )
        .unwrap();
        let addr: SocketAddr = ([127, 0, 0, 1], free_port()).into();
        let child = prometheus_tool("prometheus")
            .arg(format!("--config.file={}", config.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.path().join("data").display()
            ))
            .arg(format!("--web.listen-address={addr}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("run prometheus");
        let prometheus = Self {
            _process: Process(child),
            addr,
            _dir: dir,
        };
        support::wait_for_http(addr, "/-/ready", 200);
        prometheus
    }

    /// `/api/v1/query`'s `data.result` for `expr`.
    fn query(&self, expr: &str) -> Vec<Value> {
        let path = format!("/api/v1/query?query={}", encode(expr));
        let (status, body) = http(self.addr, "GET", &path, "");
        assert_eq!(status, 200, "{expr}: {body}");
        let reply: Value = serde_json::from_str(&body).expect("JSON");
        list(&reply["data"]["result"]).to_vec()
    }

    /// Polls every query until each has returned data, for at most
    /// [`PATIENCE`]; returns those that never did.
    fn wait_for_data(&self, queries: &[(String, String)]) -> Vec<(String, String)> {
        let deadline = Instant::now() + PATIENCE;
        let mut waiting = queries.to_vec();
        while !waiting.is_empty() && Instant::now() < deadline {
            waiting.retain(|(_, expr)| self.query(expr).is_empty());
            if !waiting.is_empty() {
                std::thread::sleep(Duration::from_millis(250));
            }
        }
        waiting
    }
}

/// Requests to `/json` of `http`, over and under the limits, until dropped.
struct Load {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<u64>>,
}

impl Load {
    fn start(admin: SocketAddr) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let running = stop.clone();
        let thread = std::thread::spawn(move || {
            let mut sent = 0u64;
            while !running.load(Ordering::Relaxed) {
                let (key, value) = if sent.is_multiple_of(7) {
                    ("trial", "t")
                } else {
                    ("client", ["a", "b", "c"][sent as usize % 3])
                };
                let body = format!(
                    r#"{{"domain":"obs","descriptors":[{{"entries":[{{"key":"{key}","value":"{value}"}}]}}]}}"#
                );
                let (status, _) = http(admin, "POST", "/json", &body);
                assert!(matches!(status, 200 | 429), "{status}");
                sent += 1;
            }
            sent
        });
        Self {
            stop,
            thread: Some(thread),
        }
    }
}

impl Drop for Load {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// One RLQS client, as Envoy is: a stream kept open, whose first report
/// of a bucket got an assignment.
struct RlqsClient {
    _reports: tokio::sync::mpsc::Sender<RateLimitQuotaUsageReports>,
    _actions: tonic::Streaming<RateLimitQuotaResponse>,
    _runtime: tokio::runtime::Runtime,
}

impl RlqsClient {
    fn start(grpc: &str) -> Self {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let uri = format!("http://{grpc}");
        let (reports, actions) = runtime.block_on(async {
            let mut client = RateLimitQuotaServiceClient::connect(uri)
                .await
                .expect("connect");
            let (reports, rx) = tokio::sync::mpsc::channel(4);
            let report = RateLimitQuotaUsageReports {
                domain: "obs".into(),
                bucket_quota_usages: vec![BucketQuotaUsage {
                    bucket_id: Some(BucketId {
                        bucket: [("client".to_owned(), "rlqs".to_owned())].into(),
                    }),
                    time_elapsed: Some(PbDuration::default()),
                    num_requests_allowed: 1,
                    num_requests_denied: 0,
                }],
            };
            reports.send(report).await.unwrap();
            let mut actions = client
                .stream_rate_limit_quotas(tokio_stream::wrappers::ReceiverStream::new(rx))
                .await
                .expect("stream accepted")
                .into_inner();
            let first = tokio::time::timeout(PATIENCE, actions.message()).await;
            let first = first.expect("an answer").expect("a healthy stream");
            assert!(first.is_some(), "the stream ended unanswered");
            (reports, actions)
        });
        Self {
            _reports: reports,
            _actions: actions,
            _runtime: runtime,
        }
    }
}

/// Every alert's expression with each comparison made a `bool` one: the
/// same series, 0 or 1 instead of filtered, so it has data whenever the
/// series it reads do (whether the alert would fire is promtool's test).
fn alert_queries() -> Vec<(String, String)> {
    alert_rules()
        .iter()
        .map(|rule| {
            let expr = s(&rule["expr"], "expr");
            assert!(
                !expr.contains(">=") && !expr.contains("<") && !expr.contains("=="),
                "{expr}: only `>` is turned into `> bool` here"
            );
            let name = s(&rule["alert"], "alert").to_owned();
            (name, expr.replace(" > ", " > bool "))
        })
        .collect()
}

/// Sluice serving `args` under load, scraped by Prometheus: every query
/// of the dashboard and of the alerts returns data, but those containing
/// one of `empty_by_design`, which must return none; and every alert rule
/// loaded and evaluates.
fn every_expression_returns_data(args: &[&str], empty_by_design: &[&str]) {
    let dir = tempfile::tempdir().unwrap();
    let rules = dir.path().join("rules.yaml");
    std::fs::write(&rules, LOAD_RULES).unwrap();
    let mut all = vec!["--rules", rules.to_str().unwrap()];
    all.extend_from_slice(args);
    let (_sluice, grpc, http_addr) = support::start_binary_with_http(&all);
    let _load = Load::start(http_addr);
    let _rlqs = RlqsClient::start(&grpc);
    let prometheus = Prometheus::start(http_addr);

    let mut queries = dashboard_queries();
    queries.extend(alert_queries());
    let (absent, queries): (Vec<_>, Vec<_>) = queries
        .into_iter()
        .partition(|(_, expr)| empty_by_design.iter().any(|e| expr.contains(e)));
    assert_eq!(
        absent.is_empty(),
        empty_by_design.is_empty(),
        "{empty_by_design:?} matches no query"
    );
    let empty = prometheus.wait_for_data(&queries);
    assert!(
        empty.is_empty(),
        "{args:?}: no data from Prometheus for {empty:#?}"
    );
    // Asked once every other query has data, so their series are scraped.
    for (title, expr) in absent {
        let result = prometheus.query(&expr);
        assert!(result.is_empty(), "{title}: {expr} has data: {result:?}");
    }
    // Hits of the over-limit client were refused, and the configured limit
    // is what the rules say.
    let over = prometheus.query(r#"sum(sluice_over_limit_total{limit="per-client"}) > 0"#);
    assert!(!over.is_empty(), "no over-limit hits recorded");
    let limit = prometheus.query(r#"sluice_limit{domain="obs",limit="per-client",window="1s"}"#);
    assert_eq!(limit[0]["value"][1], "5", "{limit:?}");
    // The RLQS series come from a real stream, not only their zeros.
    for expr in [
        r#"sluice_rlqs_assignments_total{kind="token_bucket"} > 0"#,
        "sluice_rlqs_streams_opened_total > 0",
    ] {
        let deadline = Instant::now() + PATIENCE;
        while prometheus.query(expr).is_empty() {
            assert!(Instant::now() < deadline, "no data for {expr}");
            std::thread::sleep(Duration::from_millis(250));
        }
    }
    // Prometheus loaded and evaluated every alert rule.
    let (status, head, body) = support::http_exchange(prometheus.addr, "GET", "/api/v1/rules", "");
    assert_eq!(status, 200, "{body}");
    let body = if head.contains("transfer-encoding: chunked") {
        dechunk(&body)
    } else {
        body
    };
    let reply: Value = serde_json::from_str(&body).expect("JSON");
    let loaded: Vec<&Value> = list(&reply["data"]["groups"])
        .iter()
        .flat_map(|g| list(&g["rules"]))
        .collect();
    assert_eq!(loaded.len(), alert_rules().len(), "{body}");
    for rule in loaded {
        assert_eq!(rule["health"], "ok", "{rule}");
    }
}

/// An HTTP/1.1 chunked body, its chunks joined.
fn dechunk(mut body: &str) -> String {
    let mut out = String::new();
    while let Some((size, rest)) = body.split_once("\r\n") {
        let size = usize::from_str_radix(size.trim(), 16).expect("a chunk size");
        if size == 0 {
            break;
        }
        out.push_str(&rest[..size]);
        body = &rest[size + 2..];
    }
    out
}

#[test]
fn a_real_prometheus_has_data_for_every_dashboard_and_alert_expression_on_the_memory_store() {
    every_expression_returns_data(&[], &[]);
}

#[test]
fn a_real_prometheus_has_data_for_every_dashboard_and_alert_expression_on_redis() {
    let redis = RedisServer::start();
    let url = redis.url();
    // The memory store's occupancy is a share of its caps, which are 0
    // with Redis: the panel filters those replicas out, so it is empty
    // (the alert keeps them, with a NaN share that never fires).
    every_expression_returns_data(
        &["--redis-url", &url],
        &[
            "/ (sluice_memory_store_max_keys > 0)",
            "/ (sluice_memory_store_max_bytes > 0)",
        ],
    );
}
