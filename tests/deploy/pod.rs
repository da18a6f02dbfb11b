//! Kubernetes: the binary run with each overlay's pod spec (need kubectl):
//! probes, gRPC health and staged shutdown.

use super::*;

/// A running `sluice` and where it listens.
pub(crate) struct Running {
    pub(crate) process: Process,
    pub(crate) grpc: SocketAddr,
    pub(crate) http: SocketAddr,
}

/// Reads the listen addresses from a human or JSON log line.
pub(crate) fn listening(line: &str) -> Option<(SocketAddr, SocketAddr)> {
    if !line.contains("sluice listening") {
        return None;
    }
    let field = |name: &str| -> Option<SocketAddr> {
        let start = line
            .find(&format!("\"{name}\":\""))
            .map(|i| i + name.len() + 4)
            .or_else(|| line.find(&format!("{name}=")).map(|i| i + name.len() + 1))?;
        let rest = &line[start..];
        let end = rest.find(['"', ' ']).unwrap_or(rest.len());
        rest[..end].parse().ok()
    };
    Some((field("grpc")?, field("http")?))
}

/// Starts `/sluice ARGS` with exactly `env`, the listen addresses moved to
/// loopback port 0.
pub(crate) fn start(args: &[String], env: &BTreeMap<String, String>, label: &str) -> Running {
    let sluice = Command::new(env!("CARGO_BIN_EXE_sluice"));
    start_command(sluice, args, env, label)
}

/// As [`start`], running `program` as it is set up (its path, user and
/// working directory).
pub(crate) fn start_command(
    mut program: Command,
    args: &[String],
    env: &BTreeMap<String, String>,
    label: &str,
) -> Running {
    let mut kept = Vec::new();
    let mut skip = false;
    for arg in args {
        if skip {
            skip = false;
        } else if arg == "--grpc-addr" || arg == "--http-addr" {
            skip = true;
        } else if !arg.starts_with("--grpc-addr=") && !arg.starts_with("--http-addr=") {
            kept.push(arg.clone());
        }
    }
    kept.extend([
        "--grpc-addr=127.0.0.1:0".into(),
        "--http-addr=127.0.0.1:0".into(),
    ]);
    let mut child = program
        .args(&kept)
        .env_clear()
        .envs(env)
        .stderr(Stdio::piped())
        .spawn()
        .expect("run sluice");
    let stderr = child.stderr.take().unwrap();
    let process = Process(child);
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines() {
            let Ok(line) = line else { break };
            if tx.send(line).is_err() {
                // Keep draining so the server never blocks on a full pipe.
                continue;
            }
        }
    });
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut log = Vec::new();
    while Instant::now() < deadline {
        match rx.recv_timeout(Duration::from_millis(200)) {
            Ok(line) => {
                if let Some((grpc, http)) = listening(&line) {
                    return Running {
                        process,
                        grpc,
                        http,
                    };
                }
                log.push(line);
            }
            Err(mpsc::RecvTimeoutError::Timeout) => {}
            Err(mpsc::RecvTimeoutError::Disconnected) => break,
        }
    }
    panic!(
        "{label}: sluice did not start with {kept:?}:\n{}",
        log.join("\n")
    );
}

pub(crate) fn wait_for_status(addr: SocketAddr, path: &str, want: u16, within: Duration) -> u16 {
    let deadline = Instant::now() + within;
    loop {
        let (status, _) = http(addr, "GET", path, "");
        if status == want || Instant::now() >= deadline {
            return status;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

pub(crate) async fn grpc_health(addr: SocketAddr, service: &str) -> i32 {
    use tonic_health::pb::HealthCheckRequest;
    use tonic_health::pb::health_client::HealthClient;
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect()
        .await
        .expect("connect to gRPC");
    let mut client = HealthClient::new(channel);
    client
        .check(HealthCheckRequest {
            service: service.into(),
        })
        .await
        .expect("a health answer")
        .into_inner()
        .status
}

pub(crate) const SERVING: i32 =
    tonic_health::pb::health_check_response::ServingStatus::Serving as i32;
pub(crate) const NOT_SERVING: i32 =
    tonic_health::pb::health_check_response::ServingStatus::NotServing as i32;

/// Runs the binary as the overlay's pod would, against `redis_url` (a local
/// stand-in for the overlay's Redis, when it has one), and checks probes,
/// rules, health and staged shutdown.
pub(crate) async fn run_as_the_pod(overlay: &str, redis_url: Option<String>) {
    let docs = overlay_docs(overlay);
    let w = Workload::new(overlay, &docs);
    let (mount, configmap) = w.rules_mount();
    let mount_path = s(&mount["mountPath"], "mountPath").to_owned();
    let dir = tempfile::tempdir().unwrap();
    lay_out_configmap(find(&docs, "ConfigMap", configmap).unwrap(), dir.path());
    let local = dir.path().display().to_string();
    let relocate = |v: &String| v.replace(&mount_path, &local);
    let args: Vec<String> = w.args.iter().map(relocate).collect();
    let mut env: BTreeMap<String, String> = w
        .env
        .iter()
        .map(|(k, v)| (k.clone(), relocate(v)))
        .collect();
    match (&w.settings.redis_url, redis_url) {
        (Some(_), Some(url)) => {
            env.insert("SLUICE_REDIS_URL".into(), url);
        }
        (None, None) => {}
        (set, given) => panic!("{overlay}: Redis in the overlay: {set:?}, given: {given:?}"),
    }
    let running = start(&args, &env, overlay);

    // The probes answer 200 on the paths and port the manifest names.
    for probe in ["startupProbe", "livenessProbe", "readinessProbe"] {
        let path = s(&w.container[probe]["httpGet"]["path"], "probe path");
        assert_eq!(
            wait_for_status(running.http, path, 200, Duration::from_secs(10)),
            200,
            "{overlay}: {probe} {path}"
        );
    }
    // The ConfigMap's rules are in force.
    let (status, body) = http(
        running.http,
        "POST",
        "/json",
        r#"{"domain":"example","descriptors":[{"entries":[{"key":"remote_address","value":"192.0.2.7"}]}]}"#,
    );
    assert_eq!(status, 200, "{overlay}: {body}");
    assert!(body.contains("per-address"), "{overlay}: {body}");
    // The health service names Envoy and Kubernetes may ask for.
    for service in ["", "envoy.service.ratelimit.v3.RateLimitService"] {
        assert_eq!(
            grpc_health(running.grpc, service).await,
            SERVING,
            "{service:?}"
        );
    }

    // SIGTERM: not ready at once, still serving during shutdown_delay_ms,
    // gone well within terminationGracePeriodSeconds.
    let stopped = Instant::now();
    let status = Command::new("kill")
        .args(["-TERM", &running.process.0.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    assert_eq!(
        wait_for_status(running.http, READINESS_PATH, 503, Duration::from_secs(4)),
        503,
        "{overlay}: readiness after SIGTERM"
    );
    assert_eq!(
        grpc_health(running.grpc, "").await,
        NOT_SERVING,
        "{overlay}: gRPC health after SIGTERM"
    );
    let (status, _) = http(running.http, "GET", LIVENESS_PATH, "");
    assert_eq!(status, 200, "{overlay}: still serving during the delay");
    let grace = Duration::from_secs(w.pod["terminationGracePeriodSeconds"].as_u64().unwrap());
    let mut process = running.process;
    let exit = loop {
        if let Some(exit) = process.0.try_wait().unwrap() {
            break exit;
        }
        assert!(
            stopped.elapsed() < grace,
            "{overlay}: still running after terminationGracePeriodSeconds"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(exit.success(), "{overlay}: exit status {exit}");
    assert!(
        stopped.elapsed() >= Duration::from_millis(w.settings.shutdown_delay_ms),
        "{overlay}: stopped before shutdown_delay_ms"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn the_binary_runs_with_the_memory_overlays_pod_spec() {
    run_as_the_pod("memory", None).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn the_binary_runs_with_the_redis_overlays_pod_spec() {
    // A local Redis stands in for the overlay's Redis Service.
    let redis = RedisServer::start();
    run_as_the_pod("redis", Some(redis.url())).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn the_binary_runs_with_the_redis_cluster_overlays_pod_spec() {
    let docs = overlay_docs("redis-cluster");
    let w = Workload::new("redis-cluster", &docs);
    let (_cluster, url) = redis_cluster_stand_in(&w);
    run_as_the_pod("redis-cluster", Some(url)).await;
}

/// A local 3-master cluster with the Secret's (placeholder) password,
/// standing in for the redis-cluster overlay's external cluster, and the
/// overlay's URL pointed at it: its form kept, only its host list changed.
pub(crate) fn redis_cluster_stand_in(w: &Workload) -> (RedisCluster, String) {
    let url = w.settings.redis_url.as_ref().unwrap().expose().to_owned();
    let password = w.env["SLUICE_REDIS_PASSWORD"].clone();
    let cluster = RedisCluster::start();
    for node in cluster.nodes() {
        node.query(&["CONFIG", "SET", "requirepass", &password]);
    }
    let (scheme, rest) = url.split_once("://").expect("a URL");
    let user = rest
        .rsplit_once('@')
        .map_or(String::new(), |(u, _)| format!("{u}@"));
    let url = format!("{scheme}://{user}127.0.0.1:{}", cluster.ports()[0]);
    (cluster, url)
}
