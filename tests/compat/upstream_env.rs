//! The binary's settings from its environment. As a drop-in for
//! envoyproxy/ratelimit: run through a symlink named `ratelimit` with only
//! upstream's environment variables, it serves `/healthcheck`, counts in the
//! Redis named by REDIS_URL, serves `/rlconfig` on the debug port, fails
//! `/healthcheck` after SIGTERM while it drains, and names each upstream
//! variable it does not honour once. A bad value, of upstream's variables
//! or Sluice's own, stops it with one line naming the variable and value.

use crate::support;

use std::net::SocketAddr;
use std::process::{Command, Stdio};

use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use support::Process;
use support::redis::{Conn, RedisServer, Reply, free_port};

const RULES: &str = "domain: upstream
descriptors:
  - key: client
    rate_limit: {unit: minute, requests_per_unit: 5}
";

#[test]
fn invoked_as_ratelimit_it_serves_from_upstreams_variables() {
    let redis = RedisServer::start();
    let dir = tempfile::tempdir().unwrap();
    let rules_dir = dir.path().join("runtime/ratelimit/config");
    std::fs::create_dir_all(&rules_dir).unwrap();
    std::fs::write(rules_dir.join("rules.yaml"), RULES).unwrap();
    let binary = support::ratelimit_binary(dir.path());
    let (http, grpc, debug) = (free_port(), free_port(), free_port());

    let child = Command::new(&binary)
        .env_clear()
        .env("HOST", "127.0.0.1")
        .env("PORT", http.to_string())
        .env("GRPC_HOST", "127.0.0.1")
        .env("GRPC_PORT", grpc.to_string())
        .env("DEBUG_HOST", "127.0.0.1")
        .env("DEBUG_PORT", debug.to_string())
        .env("RUNTIME_ROOT", dir.path().join("runtime"))
        .env("RUNTIME_SUBDIRECTORY", "ratelimit")
        .env("USE_STATSD", "false")
        .env("REDIS_SOCKET_TYPE", "tcp")
        .env("REDIS_URL", format!("127.0.0.1:{}", redis.port()))
        // Kubernetes service links: upstream reads none of them.
        .env("RATELIMIT_PORT", "tcp://10.0.0.1:8081")
        .env("KUBERNETES_SERVICE_HOST", "10.0.0.2")
        // Sluice's own settings still apply on top: keep serving (and
        // failing /healthcheck) for a while after SIGTERM.
        .env("SLUICE_SHUTDOWN_DELAY_MS", "5000")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("run ratelimit");
    let mut process = Process(child);
    let http: SocketAddr = ([127, 0, 0, 1], http).into();
    let debug: SocketAddr = ([127, 0, 0, 1], debug).into();

    assert_eq!(support::wait_for_http(http, "/healthcheck", 200), "OK");
    let rlconfig = support::wait_for_http(debug, "/rlconfig", 200);
    assert!(rlconfig.contains("upstream/client"), "{rlconfig}");
    let (_, _, admin_rlconfig) = support::http_exchange(http, "GET", "/rlconfig", "");
    assert_eq!(rlconfig, admin_rlconfig);

    let runtime = tokio::runtime::Runtime::new().unwrap();
    let code = runtime.block_on(async {
        let mut client = RateLimitServiceClient::connect(format!("http://127.0.0.1:{grpc}"))
            .await
            .expect("connect to gRPC");
        let request = support::envoy_request("upstream", &[&[("client", "a")]]);
        client
            .should_rate_limit(request)
            .await
            .expect("a decision")
            .into_inner()
            .overall_code
    });
    assert_eq!(code, Code::Ok as i32);
    let keys = Conn::connect(redis.port())
        .unwrap()
        .call(&["KEYS", "*"])
        .unwrap();
    let Reply::Array(keys) = keys else {
        panic!("KEYS answered {keys:?}");
    };
    assert!(!keys.is_empty(), "the decision counted nothing in Redis");

    let pid = process.0.id().to_string();
    assert!(
        Command::new("kill")
            .args(["-TERM", &pid])
            .status()
            .unwrap()
            .success()
    );
    support::wait_for_http(http, "/healthcheck", 500);
    let status = process.0.wait().unwrap();
    assert!(status.success(), "{status:?}");
}

/// `/healthcheck` of an in-process server with no rules, then with rules.
async fn healthcheck_without_then_with_rules(with_config_loaded: bool) -> (u16, u16) {
    use sluice::decision::{Bounds, Limiter};
    use sluice::limiter::ManualClock;
    use sluice::store::{MemoryStore, MemoryStoreConfig};
    use std::sync::Arc;
    let clock = Arc::new(ManualClock::new(support::T0));
    let store = MemoryStore::new(&MemoryStoreConfig::default(), clock.clone());
    let limiter = Arc::new(Limiter::new(
        sluice::rules::RuleSet::default(),
        store,
        Bounds::default(),
    ));
    let options = sluice::server::ServeOptions {
        healthy_with_config_loaded: with_config_loaded,
        ..Default::default()
    };
    let server = support::Server::start_with_options(limiter.clone(), options, clock).await;
    let http = server.http;
    let get = move || {
        tokio::task::spawn_blocking(move || support::http(http, "GET", "/healthcheck", "").0)
    };
    let before = get().await.unwrap();
    limiter.replace_rules(support::rules(RULES));
    let after = get().await.unwrap();
    server.stop().await;
    (before, after)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn healthcheck_is_200_before_any_rules_unless_asked_to_wait_for_them() {
    assert_eq!(healthcheck_without_then_with_rules(false).await, (200, 200));
    assert_eq!(healthcheck_without_then_with_rules(true).await, (500, 200));
}

/// Runs the binary (as `name`, a symlink in `dir`) with only `vars` in its
/// environment and `args`, expecting it to fail; returns its exit code and
/// stderr.
fn fails_to_start(
    dir: &std::path::Path,
    name: &str,
    args: &[&str],
    vars: &[(&str, &str)],
) -> (Option<i32>, String) {
    let binary = if name == "ratelimit" {
        support::ratelimit_binary(dir)
    } else {
        env!("CARGO_BIN_EXE_sluice").into()
    };
    let out = Command::new(binary)
        .args(args)
        .env_clear()
        .envs(vars.iter().copied())
        .stdin(Stdio::null())
        .output()
        .expect("run the binary");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// The binary's name, its arguments, its environment, and what it must
/// print.
type Case<'a> = (&'a str, &'a [&'a str], &'a [(&'a str, &'a str)], &'a str);

#[test]
fn a_bad_setting_stops_the_start_with_one_line_naming_its_variable_and_value() {
    let dir = tempfile::tempdir().unwrap();
    let serve = ["serve"];
    let cases: [Case; 5] = [
        (
            "sluice",
            &serve,
            &[("SLUICE_GRPC_ADDR", "abc")],
            "sluice: invalid SLUICE_GRPC_ADDR=\"abc\": invalid socket address syntax\n",
        ),
        (
            "sluice",
            &serve,
            &[("SLUICE_REDIS_TIMEOUT_MS", "soon")],
            "sluice: invalid SLUICE_REDIS_TIMEOUT_MS=\"soon\": expected a whole number\n",
        ),
        (
            "sluice",
            &serve,
            &[("SLUICE_ON_STORE_ERROR", "panic")],
            "sluice: invalid SLUICE_ON_STORE_ERROR=\"panic\": expected one of unavailable, allow, deny\n",
        ),
        (
            "sluice",
            &serve,
            &[("SLUICE_COUNTING", "sometimes")],
            "sluice: invalid SLUICE_COUNTING=\"sometimes\": expected one of admitted, always\n",
        ),
        (
            "ratelimit",
            &[],
            &[("PORT", "abc")],
            "sluice: invalid PORT=\"abc\": expected a port number (0 to 65535)\n",
        ),
    ];
    for (name, args, vars, expected) in cases {
        let (code, stderr) = fails_to_start(dir.path(), name, args, vars);
        assert_eq!(code, Some(2), "{vars:?}: {stderr}");
        assert_eq!(stderr, expected, "{vars:?}");
        if name == "ratelimit" {
            std::fs::remove_file(dir.path().join("ratelimit")).unwrap();
        }
    }
    // A settings-file key, with the file.
    let file = dir.path().join("sluice.yaml");
    std::fs::write(&file, "max_entries: many\n").unwrap();
    let path = file.display().to_string();
    let (code, stderr) = fails_to_start(dir.path(), "sluice", &["serve", "--config", &path], &[]);
    assert_eq!(code, Some(2), "{stderr}");
    assert_eq!(
        stderr,
        format!("sluice: invalid max_entries = \"many\" in {path}: expected a whole number\n")
    );
    // An error found later, with its cause, is still said once.
    let (code, stderr) = fails_to_start(
        dir.path(),
        "sluice",
        &serve,
        &[
            ("SLUICE_GRPC_ADDR", "127.0.0.1:0"),
            ("SLUICE_HTTP_ADDR", "127.0.0.1:0"),
            ("SLUICE_GRPC_TLS_CERT", "/nonexistent/tls.crt"),
            ("SLUICE_GRPC_TLS_KEY", "/nonexistent/tls.key"),
        ],
    );
    assert_eq!(code, Some(2), "{stderr}");
    let last = stderr.lines().last().unwrap_or_default();
    assert!(last.starts_with("sluice: "), "{stderr}");
    assert_eq!(last.matches("/nonexistent/tls.crt").count(), 1, "{stderr}");
    assert_eq!(last.matches("No such file").count(), 1, "{stderr}");
    // A flag: clap's own message names it and the value, once.
    let (code, stderr) =
        fails_to_start(dir.path(), "sluice", &["serve", "--grpc-addr", "abc"], &[]);
    assert_eq!(code, Some(2), "{stderr}");
    assert!(
        stderr.starts_with(
            "error: invalid value 'abc' for '--grpc-addr <ADDR>': invalid socket address syntax\n"
        ),
        "{stderr}"
    );
    assert_eq!(
        stderr.matches("invalid socket address syntax").count(),
        1,
        "{stderr}"
    );
}

#[test]
fn every_unsupported_upstream_variable_set_is_named_once_at_start() {
    use sluice::settings::unsupported::UNSUPPORTED;
    let dir = tempfile::tempdir().unwrap();
    let rules_dir = dir.path().join("runtime/config");
    std::fs::create_dir_all(&rules_dir).unwrap();
    std::fs::write(rules_dir.join("rules.yaml"), RULES).unwrap();
    let binary = support::ratelimit_binary(dir.path());
    let (http, grpc, debug) = (free_port(), free_port(), free_port());
    let mut command = Command::new(&binary);
    command
        .env_clear()
        .env("HOST", "127.0.0.1")
        .env("PORT", http.to_string())
        .env("GRPC_HOST", "127.0.0.1")
        .env("GRPC_PORT", grpc.to_string())
        .env("DEBUG_HOST", "127.0.0.1")
        .env("DEBUG_PORT", debug.to_string())
        .env("RUNTIME_ROOT", dir.path().join("runtime"))
        .env("USE_STATSD", "false");
    // A value under which upstream and Sluice differ, for every variable.
    for u in UNSUPPORTED {
        command.env(u.name, "set-by-a-test");
    }
    let child = command
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run ratelimit");
    let mut process = Process(child);
    let http: SocketAddr = ([127, 0, 0, 1], http).into();
    assert_eq!(support::wait_for_http(http, "/healthcheck", 200), "OK");
    let pid = process.0.id().to_string();
    assert!(
        Command::new("kill")
            .args(["-TERM", &pid])
            .status()
            .unwrap()
            .success()
    );
    let mut stderr = String::new();
    use std::io::Read as _;
    process
        .0
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut stderr)
        .unwrap();
    assert!(process.0.wait().unwrap().success(), "{stderr}");
    for u in UNSUPPORTED {
        let line = format!("{} is not supported: {}", u.name, u.instead);
        assert_eq!(stderr.matches(&line).count(), 1, "{line}\nin:\n{stderr}");
    }
    assert_eq!(
        stderr.matches(" is not supported: ").count(),
        UNSUPPORTED.len(),
        "{stderr}"
    );
}
