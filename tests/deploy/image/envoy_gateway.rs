//! The image run as Envoy Gateway's rate-limit Deployment.

use super::*;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use support::ads::{Management, mutual_tls};
use support::certs::Ca;
use support::redis::free_port;

use sluice::proto::ratelimit::config::ratelimit::v3::{
    RateLimitConfig, RateLimitDescriptor, RateLimitPolicy, RateLimitUnit,
};

/// The files of the Secret or ConfigMap `source` of EG's Deployment.
fn eg_volume(source: &str, ca: &Ca, leaf: &support::certs::Leaf) -> Vec<(&'static str, String)> {
    match source {
        "envoy-rate-limit" => vec![
            ("tls.crt", leaf.cert_pem.clone()),
            ("tls.key", leaf.key_pem.clone()),
            ("ca.crt", ca.pem()),
        ],
        "statsd-exporter-config" => vec![(
            "conf.yaml",
            read(&repo().join("tests/fixtures/eg_statsd_mapping.yaml")),
        )],
        other => panic!("no contents for volume source {other}"),
    }
}

/// Mounts EG's volumes into `root` as the kubelet would (files readable by
/// any user), and writes the `/etc/hosts` a kubelet writes, with `names`
/// for loopback (the stand-ins for EG's xDS server and Redis).
fn eg_mounts(root: &Path, pod: &Value, ca: &Ca, leaf: &support::certs::Leaf, names: &[&str]) {
    use std::os::unix::fs::PermissionsExt as _;
    let container = &pod["containers"][0];
    for mount in list(&container["volumeMounts"]) {
        let name = &mount["name"];
        let volume = list(&pod["volumes"])
            .iter()
            .find(|v| v["name"] == *name)
            .unwrap_or_else(|| panic!("no volume {name}"));
        let source = volume["secret"]["secretName"]
            .as_str()
            .or(volume["configMap"]["name"].as_str())
            .expect("a Secret or ConfigMap volume");
        let dir = root.join(s(&mount["mountPath"], "mountPath").trim_start_matches('/'));
        std::fs::create_dir_all(&dir).unwrap();
        for (file, body) in eg_volume(source, ca, leaf) {
            std::fs::write(dir.join(file), body).unwrap();
            std::fs::set_permissions(dir.join(file), std::fs::Permissions::from_mode(0o644))
                .unwrap();
        }
    }
    let hosts = format!("127.0.0.1\tlocalhost {}\n", names.join(" "));
    std::fs::write(root.join("etc/hosts"), hosts).unwrap();
}

/// Envoy Gateway's rate-limit Deployment (tests/fixtures/
/// eg_ratelimit_deployment.yaml, EG's default render) with its image
/// swapped for this one: EG's command, user, environment and mounts, the
/// listen ports moved to free ones, its xDS server and Redis on loopback
/// under their names. It serves, `/healthcheck` answers, it takes EG's
/// rules over xDS with mutual TLS and enforces them on its mutual-TLS gRPC
/// port.
#[tokio::test(flavor = "multi_thread")]
async fn the_image_runs_as_envoy_gateways_rate_limit_deployment() {
    if !is_root() {
        eprintln!("skipped: running the image under chroot needs root");
        return;
    }
    let _ = rustls::crypto::ring::default_provider().install_default();
    let doc = &yaml_file(&repo().join("tests/fixtures/eg_ratelimit_deployment.yaml"))[0];
    let pod = &doc["spec"]["template"]["spec"];
    let container = &pod["containers"][0];
    let command: Vec<String> = serde_json::from_value(container["command"].clone()).unwrap();
    assert_eq!(command, ["/bin/ratelimit"], "EG's command");
    let context = &container["securityContext"];
    let user = format!("{}:{}", context["runAsUser"], context["runAsGroup"]);

    let ca = Ca::rsa("envoy-gateway");
    let controller = ca.eg_leaf("envoy-gateway", &["envoy-gateway"]);
    let leaf = ca.eg_leaf("envoy", &["*.envoy-gateway-system"]);
    let tls = mutual_tls(&controller.cert_pem, &controller.key_pem, &ca.pem());
    let mut management = Management::start(Some(tls)).await;
    let redis = RedisServer::start();
    let bundle = unpack(layout("amd64", "SLUICE_TEST_IMAGE"));
    let root = rootfs(&bundle);

    let names = eg_hosts(container);
    eg_mounts(&root, pod, &ca, &leaf, &[&names.0, &names.1]);
    let (http_port, grpc_port) = (free_port(), free_port());
    let servers = (management.addr.port(), redis.port());
    let env = eg_env(container, &names, servers, (http_port, grpc_port));
    let log = std::fs::File::create(bundle.path().join("ratelimit.log")).unwrap();
    let _process = support::Process(
        chroot(&root, &user, &command)
            .env_clear()
            .envs(&env)
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("run the image's /bin/ratelimit"),
    );
    let http_addr: SocketAddr = ([127, 0, 0, 1], http_port).into();
    tokio::task::spawn_blocking(move || support::wait_for_http(http_addr, "/healthcheck", 200))
        .await
        .unwrap();

    let domain = "default/eg/http";
    management.push("1", vec![eg_rules(domain)]);
    let nonce = management.nonce_of("1").await;
    let ack = management.answer_to(&nonce).await;
    assert!(
        ack.version_info == "1" && ack.error_detail.is_none(),
        "EG's rules are accepted: {ack:?}\n{}",
        read(&bundle.path().join("ratelimit.log"))
    );
    // As EG's Envoy calls it: mutual TLS, the chain checked, not the name.
    let config = support::certs::chain_only_client_config(&ca, Some(&leaf));
    let (channel, _) = support::certs::channel(([127, 0, 0, 1], grpc_port).into(), config)
        .await
        .expect("mutual TLS with a certificate of EG's CA");
    let mut client = RateLimitServiceClient::new(channel);
    let mut codes = Vec::new();
    for _ in 0..3 {
        let request = support::envoy_request(domain, &[&[("generic_key", "image")]]);
        let reply = client.should_rate_limit(request).await.expect("a decision");
        codes.push(Code::try_from(reply.into_inner().overall_code).unwrap());
    }
    assert_eq!(codes, [Code::Ok, Code::Ok, Code::OverLimit], "2 an hour");
}

/// The hosts of EG's xDS server and Redis, from the Deployment's env.
fn eg_hosts(container: &Value) -> (String, String) {
    let host = |name: &str| {
        let value = list(&container["env"])
            .iter()
            .find(|e| e["name"] == name)
            .map(|e| s(&e["value"], name).to_owned())
            .unwrap_or_else(|| panic!("EG sets {name}"));
        value.rsplit_once(':').unwrap().0.to_owned()
    };
    (host("CONFIG_GRPC_XDS_SERVER_URL"), host("REDIS_URL"))
}

/// EG's environment, as it renders it, with only the addresses changed:
/// the xDS server's and Redis's ports (`servers`), and free loopback ports
/// to listen on (`listen`: HTTP, gRPC).
fn eg_env(
    container: &Value,
    (xds_host, redis_host): &(String, String),
    (xds, redis): (u16, u16),
    (http, grpc): (u16, u16),
) -> BTreeMap<String, String> {
    let mut env: BTreeMap<String, String> = list(&container["env"])
        .iter()
        .map(|e| {
            (
                s(&e["name"], "name").to_owned(),
                s(&e["value"], "value").to_owned(),
            )
        })
        .collect();
    for (name, value) in [
        ("CONFIG_GRPC_XDS_SERVER_URL", format!("{xds_host}:{xds}")),
        ("REDIS_URL", format!("{redis_host}:{redis}")),
        ("PROMETHEUS_ADDR", format!("127.0.0.1:{}", free_port())),
        ("HOST", "127.0.0.1".into()),
        ("PORT", http.to_string()),
        ("GRPC_HOST", "127.0.0.1".into()),
        ("GRPC_PORT", grpc.to_string()),
        ("DEBUG_HOST", "127.0.0.1".into()),
        ("DEBUG_PORT", free_port().to_string()),
    ] {
        env.insert(name.into(), value);
    }
    env
}

/// An EG-shaped RateLimitConfig: `generic_key=image`, 2 requests an hour.
fn eg_rules(domain: &str) -> RateLimitConfig {
    RateLimitConfig {
        name: domain.into(),
        domain: domain.into(),
        descriptors: vec![RateLimitDescriptor {
            key: "generic_key".into(),
            value: "image".into(),
            rate_limit: Some(RateLimitPolicy {
                unit: RateLimitUnit::Hour as i32,
                requests_per_unit: 2,
                ..Default::default()
            }),
            ..Default::default()
        }],
    }
}
