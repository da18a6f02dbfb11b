//! Envoy and Istio: the front proxy's configuration and the EnvoyFilter.

use super::*;

pub(crate) fn example_rules() -> RuleSet {
    load_paths(&[repo().join("examples/rules.yaml")]).expect("the example rules load")
}

/// The sample request the descriptors are computed for.
pub(crate) const SAMPLE_CLIENT: &str = "192.0.2.7";

pub(crate) fn sample_header(name: &str, path: &str) -> String {
    match name {
        ":path" | "x-sluice-path" => path.to_owned(),
        "x-api-key" => "key-1".into(),
        "x-tenant" => "acme".into(),
        "x-user" => "alice".into(),
        "x-plan" => "free".into(),
        other => panic!("no sample value for the header {other}: add one to this test"),
    }
}

/// The descriptors Envoy builds from `rate_limits` for the sample request
/// on `path`, following Envoy's rules for each action.
pub(crate) fn descriptors(rate_limits: &Value, path: &str) -> Vec<Vec<(String, String)>> {
    let mut out = Vec::new();
    for rate_limit in list(rate_limits) {
        assert!(
            rate_limit["stage"].as_u64().unwrap_or(0) == 0,
            "the filter runs stage 0 only"
        );
        let mut entries = Vec::new();
        for action in list(&rate_limit["actions"]) {
            let (kind, spec) = action
                .as_object()
                .and_then(|o| o.iter().next())
                .expect("an action");
            let entry = match kind.as_str() {
                "remote_address" => ("remote_address".to_owned(), SAMPLE_CLIENT.to_owned()),
                "request_headers" => (
                    s(&spec["descriptor_key"], "descriptor_key").to_owned(),
                    sample_header(s(&spec["header_name"], "header_name"), path),
                ),
                "generic_key" => (
                    spec["descriptor_key"]
                        .as_str()
                        .unwrap_or("generic_key")
                        .to_owned(),
                    s(&spec["descriptor_value"], "descriptor_value").to_owned(),
                ),
                "header_value_match" => (
                    spec["descriptor_key"]
                        .as_str()
                        .unwrap_or("header_match")
                        .to_owned(),
                    s(&spec["descriptor_value"], "descriptor_value").to_owned(),
                ),
                other => panic!("this test does not model the action {other}"),
            };
            entries.push(entry);
        }
        assert!(!entries.is_empty(), "a rate_limits entry without actions");
        out.push(entries);
    }
    out
}

/// Each descriptor gets a limit from the domain's rules.
pub(crate) fn assert_limited(domain: &str, descriptors: &[Vec<(String, String)>], label: &str) {
    let rules = example_rules();
    let domain = rules
        .domain(domain)
        .unwrap_or_else(|| panic!("{label}: the domain {domain} is not in examples/rules.yaml"));
    assert!(!descriptors.is_empty(), "{label}: no descriptors");
    for descriptor in descriptors {
        let entries: Vec<Entry> = descriptor
            .iter()
            .map(|(key, value)| Entry {
                key: key.clone(),
                value: value.clone(),
            })
            .collect();
        let found = domain
            .find(&entries)
            .unwrap_or_else(|| panic!("{label}: no rule limits {descriptor:?}"));
        assert!(
            !found.rule.limits.is_empty(),
            "{label}: {descriptor:?} matches {} which has no limit",
            found.rule.path
        );
    }
}

/// A sample path that a route's `match` accepts.
pub(crate) fn sample_path(route_match: &Value) -> String {
    if let Some(prefix) = route_match["prefix"].as_str() {
        format!("{}/sample", prefix.trim_end_matches('/'))
    } else if let Some(path) = route_match["path"].as_str() {
        path.to_owned()
    } else {
        panic!("this test knows prefix and path matches only: {route_match}")
    }
}

pub(crate) fn seconds(duration: &Value) -> f64 {
    s(duration, "a duration")
        .strip_suffix('s')
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("not a protobuf duration: {duration}"))
}

/// Checks the rate-limit filter's settings; returns its domain and the
/// cluster it calls.
pub(crate) fn check_ratelimit_filter(filter: &Value, label: &str) -> (String, String) {
    assert_eq!(filter["name"], "envoy.filters.http.ratelimit", "{label}");
    let config = &filter["typed_config"];
    assert_eq!(
        config["@type"], "type.googleapis.com/envoy.extensions.filters.http.ratelimit.v3.RateLimit",
        "{label}"
    );
    let domain = s(&config["domain"], "domain").to_owned();
    assert!(
        example_rules().domain(&domain).is_some(),
        "{label}: domain {domain} is not in examples/rules.yaml"
    );
    assert_eq!(config["stage"].as_u64().unwrap_or(0), 0, "{label}: stage");
    let service = &config["rate_limit_service"];
    assert_eq!(service["transport_api_version"], "V3", "{label}");
    let timeout_ms = seconds(&config["timeout"]) * 1000.0;
    let redis_ms = Settings::default().redis_timeout_ms.get() as f64;
    assert!(
        timeout_ms > redis_ms,
        "{label}: Envoy's timeout ({timeout_ms} ms) must exceed Sluice's redis_timeout_ms ({redis_ms} ms)"
    );
    assert!(
        config["failure_mode_deny"].is_boolean(),
        "{label}: failure_mode_deny is a decision to write down"
    );
    assert_eq!(
        config["enable_x_ratelimit_headers"], "DRAFT_VERSION_03",
        "{label}"
    );
    let cluster = s(
        &service["grpc_service"]["envoy_grpc"]["cluster_name"],
        "cluster_name",
    );
    (domain, cluster.to_owned())
}

pub(crate) fn envoy_config() -> Value {
    yaml_file(&deploy("envoy/envoy.yaml")).remove(0)
}

/// The HTTP connection managers of every listener.
pub(crate) fn connection_managers(config: &Value) -> Vec<&Value> {
    list(&config["static_resources"]["listeners"])
        .iter()
        .flat_map(|l| list(&l["filter_chains"]))
        .flat_map(|c| list(&c["filters"]))
        .filter(|f| f["name"] == "envoy.filters.network.http_connection_manager")
        .map(|f| &f["typed_config"])
        .collect()
}

#[test]
fn envoy_calls_sluices_grpc_port_over_http2() {
    let config = envoy_config();
    let managers = connection_managers(&config);
    assert!(!managers.is_empty(), "no HTTP connection manager");
    for hcm in managers {
        let filters = list(&hcm["http_filters"]);
        let at = filters
            .iter()
            .position(|f| f["name"] == "envoy.filters.http.ratelimit")
            .expect("the rate-limit filter");
        let router = filters
            .iter()
            .position(|f| f["name"] == "envoy.filters.http.router")
            .expect("the router");
        assert!(
            at < router,
            "the rate-limit filter must run before the router"
        );
        let (_, cluster_name) = check_ratelimit_filter(&filters[at], "envoy.yaml");
        let cluster = list(&config["static_resources"]["clusters"])
            .iter()
            .find(|c| c["name"] == cluster_name.as_str())
            .unwrap_or_else(|| panic!("no cluster {cluster_name}"));
        let http2 = &cluster["typed_extension_protocol_options"]["envoy.extensions.upstreams.http.v3.HttpProtocolOptions"];
        assert_eq!(
            http2["@type"],
            "type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions"
        );
        assert!(
            http2["explicit_http_config"]["http2_protocol_options"].is_object(),
            "gRPC needs HTTP/2 to {cluster_name}"
        );
        let ports: Vec<u64> = list(&cluster["load_assignment"]["endpoints"])
            .iter()
            .flat_map(|e| list(&e["lb_endpoints"]))
            .map(|e| {
                e["endpoint"]["address"]["socket_address"]["port_value"]
                    .as_u64()
                    .expect("a port")
            })
            .collect();
        let grpc = u64::from(Settings::default().grpc_addr.port());
        assert!(
            !ports.is_empty() && ports.iter().all(|&p| p == grpc),
            "cluster {cluster_name} ports {ports:?}, Sluice's gRPC port is {grpc}"
        );
    }
}

#[test]
fn envoys_route_actions_produce_descriptors_the_example_rules_limit() {
    let config = envoy_config();
    for hcm in connection_managers(&config) {
        let filter = list(&hcm["http_filters"])
            .iter()
            .find(|f| f["name"] == "envoy.filters.http.ratelimit")
            .unwrap();
        let (domain, _) = check_ratelimit_filter(filter, "envoy.yaml");
        let mut routes = 0;
        for vhost in list(&hcm["route_config"]["virtual_hosts"]) {
            assert!(
                vhost["rate_limits"].is_null(),
                "rate_limits belong to the routes here"
            );
            for route in list(&vhost["routes"]) {
                let path = sample_path(&route["match"]);
                let label = format!("envoy.yaml route {path}");
                assert!(
                    route["rate_limits"].is_null(),
                    "{label}: rate_limits go in the route action (route.rate_limits)"
                );
                let produced = descriptors(&route["route"]["rate_limits"], &path);
                assert_limited(&domain, &produced, &label);
                routes += 1;
            }
        }
        assert!(routes > 0, "no routes");
    }
}

#[tokio::test]
async fn envoys_health_check_names_a_service_sluice_reports() {
    let config = envoy_config();
    let names: Vec<String> = list(&config["static_resources"]["clusters"])
        .iter()
        .flat_map(|c| list(&c["health_checks"]))
        .filter_map(|h| h["grpc_health_check"]["service_name"].as_str())
        .map(str::to_owned)
        .collect();
    assert!(!names.is_empty(), "no gRPC health check");
    let (_process, grpc) = support::start_binary(&[]);
    for name in names {
        assert_eq!(
            grpc_health(grpc.parse().unwrap(), &name).await,
            SERVING,
            "Sluice does not report the health service {name:?}"
        );
    }
}

pub(crate) fn istio_filter() -> Value {
    let docs = yaml_file(&deploy("envoy/istio-envoyfilter.yaml"));
    assert_eq!(docs.len(), 1);
    docs.into_iter().next().unwrap()
}

pub(crate) fn patches<'a>(
    filter: &'a Value,
    apply_to: &'a str,
) -> impl Iterator<Item = &'a Value> + 'a {
    list(&filter["spec"]["configPatches"])
        .iter()
        .filter(move |p| p["applyTo"] == apply_to)
}

#[test]
fn the_istio_filter_calls_the_sluice_service_and_limits_example_descriptors() {
    let filter = istio_filter();
    assert_eq!(filter["apiVersion"], "networking.istio.io/v1alpha3");
    assert_eq!(filter["kind"], "EnvoyFilter");

    // The outbound cluster Istio builds for the Service's gRPC port.
    let base = deploy("kubernetes/base");
    let namespace = s(
        &yaml_file(&base.join("kustomization.yaml"))[0]["namespace"],
        "base namespace",
    )
    .to_owned();
    let services = yaml_file(&base.join("service.yaml"));
    let service = find(&services, "Service", "sluice").expect("Service sluice");
    let port = list(&service["spec"]["ports"])
        .iter()
        .find(|p| p["name"] == "grpc")
        .expect("a grpc port");
    assert_eq!(
        port["appProtocol"], "grpc",
        "Istio must know the port speaks gRPC (HTTP/2)"
    );
    let expected = format!(
        "outbound|{}||sluice.{namespace}.svc.cluster.local",
        port["port"]
    );

    let http_filters: Vec<&Value> = patches(&filter, "HTTP_FILTER")
        .filter(|p| p["patch"]["value"]["name"] == "envoy.filters.http.ratelimit")
        .collect();
    assert_eq!(http_filters.len(), 1);
    let patch = http_filters[0];
    assert_eq!(patch["patch"]["operation"], "INSERT_BEFORE");
    assert_eq!(
        patch["match"]["listener"]["filterChain"]["filter"]["subFilter"]["name"],
        "envoy.filters.http.router"
    );
    let context = &patch["match"]["context"];
    let (domain, cluster) = check_ratelimit_filter(&patch["patch"]["value"], "istio");
    assert_eq!(cluster, expected);

    let mut produced = Vec::new();
    for route in patches(&filter, "HTTP_ROUTE") {
        assert_eq!(&route["match"]["context"], context);
        assert_eq!(route["patch"]["operation"], "MERGE");
        // A path under /static/, where every descriptor has a rule.
        produced.extend(descriptors(
            &route["patch"]["value"]["route"]["rate_limits"],
            "/static/sample",
        ));
    }
    for vhost in patches(&filter, "VIRTUAL_HOST") {
        assert_eq!(&vhost["match"]["context"], context);
        produced.extend(descriptors(
            &vhost["patch"]["value"]["rate_limits"],
            "/sample",
        ));
    }
    assert_limited(&domain, &produced, "istio");

    // The same active health checks as the front proxy's.
    let clusters: Vec<&Value> = patches(&filter, "CLUSTER").collect();
    assert_eq!(clusters.len(), 1, "a CLUSTER patch with health checks");
    assert_eq!(
        clusters[0]["match"]["cluster"]["portNumber"], port["port"],
        "the health-checked cluster is Sluice's gRPC port"
    );
    let checks = &clusters[0]["patch"]["value"]["health_checks"];
    assert_eq!(
        checks[0]["grpc_health_check"]["service_name"],
        "envoy.service.ratelimit.v3.RateLimitService"
    );
    assert!(checks[0]["no_traffic_interval"].is_string(), "{checks}");
}

pub(crate) fn envoy_validates(envoy: &Path, config: &Path) {
    let out = Command::new(envoy)
        .args(["--mode", "validate", "-c"])
        .arg(config)
        .output()
        .expect("run envoy");
    assert!(
        out.status.success(),
        "envoy rejects {}:\n{}{}",
        config.display(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn envoy_accepts_the_front_proxy_and_the_istio_patches() {
    let envoy = envoy_binary();
    envoy_validates(&envoy, &deploy("envoy/envoy.yaml"));

    // The Istio patches, applied by hand to the front proxy: its filter in
    // place of ours, its route actions on every route, its cluster name.
    let istio = istio_filter();
    let mut config = envoy_config();
    let filter = patches(&istio, "HTTP_FILTER")
        .find(|p| p["patch"]["value"]["name"] == "envoy.filters.http.ratelimit")
        .unwrap()["patch"]["value"]
        .clone();
    let cluster =
        filter["typed_config"]["rate_limit_service"]["grpc_service"]["envoy_grpc"]["cluster_name"]
            .clone();
    let route_patch = patches(&istio, "HTTP_ROUTE").next().unwrap()["patch"]["value"].clone();
    for listener in config["static_resources"]["listeners"]
        .as_array_mut()
        .unwrap()
    {
        for chain in listener["filter_chains"].as_array_mut().unwrap() {
            for f in chain["filters"].as_array_mut().unwrap() {
                let hcm = &mut f["typed_config"];
                for http_filter in hcm["http_filters"].as_array_mut().unwrap() {
                    if http_filter["name"] == "envoy.filters.http.ratelimit" {
                        *http_filter = filter.clone();
                    }
                }
                for vhost in hcm["route_config"]["virtual_hosts"].as_array_mut().unwrap() {
                    for route in vhost["routes"].as_array_mut().unwrap() {
                        route["route"]["rate_limits"] = route_patch["route"]["rate_limits"].clone();
                    }
                }
            }
        }
    }
    for c in config["static_resources"]["clusters"]
        .as_array_mut()
        .unwrap()
    {
        if c["name"] == "sluice" {
            c["name"] = cluster.clone();
            c["load_assignment"]["cluster_name"] = cluster.clone();
        }
    }
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("istio-as-bootstrap.json");
    std::fs::write(&path, serde_json::to_string_pretty(&config).unwrap()).unwrap();
    envoy_validates(&envoy, &path);
}

/// One HTTP/1.1 GET: the status and the response head (lowercase).
pub(crate) fn get(addr: SocketAddr, path: &str) -> (u16, String) {
    let (status, head, _) = support::http_exchange(addr, "GET", path, "");
    (status, head)
}

#[test]
fn envoy_limits_requests_through_sluice_end_to_end() {
    let envoy = envoy_binary();
    // Sluice with the example rules, as `sluice serve` runs by default.
    let (sluice, grpc) = support::start_binary(&[]);
    let grpc: SocketAddr = grpc.parse().unwrap();
    let app = support::envoy::application();

    // deploy/envoy/envoy.yaml with only its addresses moved to free
    // loopback ports.
    let mut config = envoy_config();
    let listen = support::redis::free_port();
    let admin = support::redis::free_port();
    config["admin"]["address"]["socket_address"]["port_value"] = json!(admin);
    for listener in config["static_resources"]["listeners"]
        .as_array_mut()
        .unwrap()
    {
        listener["address"]["socket_address"] =
            json!({"address": "127.0.0.1", "port_value": listen});
    }
    let failure_mode_deny = list(&connection_managers(&config)[0]["http_filters"])
        .iter()
        .find(|f| f["name"] == "envoy.filters.http.ratelimit")
        .expect("the rate-limit filter")["typed_config"]["failure_mode_deny"]
        .as_bool()
        .unwrap();
    support::envoy::route_clusters(&mut config, grpc, app);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("envoy.json");
    std::fs::write(&path, serde_json::to_string(&config).unwrap()).unwrap();
    let _envoy = Process(
        Command::new(&envoy)
            .args(["--disable-hot-restart", "--log-level", "error", "-c"])
            .arg(&path)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("run envoy"),
    );
    let front: SocketAddr = ([127, 0, 0, 1], listen).into();
    let deadline = Instant::now() + Duration::from_secs(20);
    while std::net::TcpStream::connect(front).is_err() {
        assert!(Instant::now() < deadline, "Envoy did not start listening");
        std::thread::sleep(Duration::from_millis(50));
    }

    // remote_address=127.0.0.1: 10 per minute (rule per-address).
    for i in 0..10 {
        let (status, head) = get(front, "/");
        assert_eq!(status, 200, "request {i}: {head}");
        assert!(
            head.contains("x-ratelimit-limit: 10, 10;w=60;name=\"per-address\""),
            "{head}"
        );
    }
    let (status, head) = get(front, "/");
    assert_eq!(status, 429, "{head}");
    assert!(head.contains("x-envoy-ratelimited: true"), "{head}");
    assert!(head.contains("x-ratelimit-remaining: 0"), "{head}");

    // Sluice gone: failure_mode_deny decides.
    drop(sluice);
    let (status, head) = get(front, "/");
    let expected = if failure_mode_deny { 500 } else { 200 };
    assert_eq!(status, expected, "with Sluice down: {head}");
}
