//! A real Envoy 1.40, configured as EG configures it, calling the pod over
//! mutual TLS.

use super::*;

/// Envoy as EG configures it for a route with one rate-limited rule: the
/// rate-limit filter with the listener's name as domain, failing open; the
/// route's actions sending the route name and the rule's header match; and
/// `ratelimit_cluster` over HTTP/2 and TLS with EG's CA and Envoy's
/// certificate, without SNI or a SAN match. The rule matches requests with
/// `content-type: application/json` (what `support::http_exchange` sends).
/// The filter's `timeout` is what EG sets from `rateLimit.timeout`: 2 s
/// here, as a user may set it, so that an answer that is late on a loaded
/// machine (the first one waits for the TLS handshake) is still Sluice's
/// and not Envoy's 20 ms default failing open.
pub(crate) fn eg_envoy(pod: &Pod, certs: &Path, front: u16, admin: u16, app: SocketAddr) -> Value {
    let [(route, _), (matched, _)] = entries(0);
    let file = |name: &str| json!({"filename": certs.join(name).display().to_string()});
    let endpoint = |name: &str, addr: SocketAddr| {
        json!({"cluster_name": name, "endpoints": [{"lb_endpoints": [{"endpoint": {"address":
            {"socket_address": {"address": "127.0.0.1", "port_value": addr.port()}}}}]}]})
    };
    let rate_limits = json!([{"actions": [
        {"generic_key": {"descriptor_key": route, "descriptor_value": route}},
        {"header_value_match": {"descriptor_key": matched, "descriptor_value": matched,
            "expect_match": true,
            "headers": [{"name": "content-type", "string_match": {"exact": "application/json"}}]}}
    ]}]);
    let hcm = json!({
        "@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
        "stat_prefix": "http",
        "route_config": {"name": DOMAIN, "virtual_hosts": [{"name": "www_example_com", "domains": ["*"],
            "routes": [{"name": route, "match": {"prefix": "/"},
                "route": {"cluster": "app", "rate_limits": rate_limits}}]}]},
        "http_filters": [
            {"name": "envoy.filters.http.ratelimit", "typed_config": {
                "@type": "type.googleapis.com/envoy.extensions.filters.http.ratelimit.v3.RateLimit",
                "domain": DOMAIN,
                "enable_x_ratelimit_headers": "DRAFT_VERSION_03",
                "disable_x_envoy_ratelimited_header": true,
                "timeout": "2s",
                "rate_limit_service": {"transport_api_version": "V3",
                    "grpc_service": {"envoy_grpc": {"cluster_name": "ratelimit_cluster"}}}}},
            {"name": "envoy.filters.http.router", "typed_config": {
                "@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"}}
        ]
    });
    json!({
        "admin": {"address": {"socket_address": {"address": "127.0.0.1", "port_value": admin}}},
        "static_resources": {
            "listeners": [{
                "name": DOMAIN,
                "address": {"socket_address": {"address": "127.0.0.1", "port_value": front}},
                "filter_chains": [{"filters": [{
                    "name": "envoy.filters.network.http_connection_manager",
                    "typed_config": hcm
                }]}]
            }],
            "clusters": [
                {
                    "name": "ratelimit_cluster",
                    "type": "STATIC",
                    "connect_timeout": "10s",
                    "typed_extension_protocol_options": {
                        "envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
                            "@type": "type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions",
                            "explicit_http_config": {"http2_protocol_options": {}}
                        }
                    },
                    "transport_socket": {"name": "envoy.transport_sockets.tls", "typed_config": {
                        "@type": "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.UpstreamTlsContext",
                        "common_tls_context": {
                            "tls_params": {"tls_maximum_protocol_version": "TLSv1_3"},
                            "tls_certificates": [{"certificate_chain": file("tls.crt"),
                                "private_key": file("tls.key")}],
                            "validation_context": {"trusted_ca": file("ca.crt")}
                        }
                    }},
                    "load_assignment": endpoint("ratelimit_cluster", pod.grpc)
                },
                {
                    "name": "app",
                    "type": "STATIC",
                    "connect_timeout": "1s",
                    "load_assignment": endpoint("app", app)
                }
            ]
        }
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
pub(crate) async fn envoy_over_mtls_is_limited_by_the_xds_rules() {
    const LIMIT: u64 = 3;
    let mut pod = Pod::start(Render::Default).await;
    pod.probe(200).await;
    pod.apply("1", vec![eg_config(&[(0, LIMIT as u32)])]).await;

    // Envoy's Secret: its own certificate and EG's CA.
    let certs = tempfile::tempdir().unwrap();
    let pki = &*PKI;
    for (name, body) in [
        ("tls.crt", pki.envoy.cert_pem.clone()),
        ("tls.key", pki.envoy.key_pem.clone()),
        ("ca.crt", pki.ca.pem()),
    ] {
        std::fs::write(certs.path().join(name), body).unwrap();
    }
    let (front, admin) = (free_port(), free_port());
    let config = eg_envoy(&pod, certs.path(), front, admin, application());
    let front: SocketAddr = ([127, 0, 0, 1], front).into();
    let admin: SocketAddr = ([127, 0, 0, 1], admin).into();

    let (statuses, envoy) = tokio::task::spawn_blocking(move || {
        let envoy = Envoy::start(&config, front, admin);
        let statuses: Vec<u16> = (0..=LIMIT)
            .map(|_| support::http_exchange(front, "GET", "/", "").0)
            .collect();
        (statuses, envoy)
    })
    .await
    .unwrap();
    let mut expected = vec![200; LIMIT as usize];
    expected.push(429);
    assert_eq!(statuses, expected);
    // Each answer was Sluice's, not a failure let through (Envoy counts
    // them under the route's cluster).
    let stat = |name: &str| envoy.stat(&format!("cluster.app.ratelimit.{name}"));
    assert_eq!(stat("ok"), LIMIT);
    assert_eq!(stat("over_limit"), 1);
    assert_eq!(stat("error"), 0);
    assert!(
        envoy.stat("cluster.ratelimit_cluster.ssl.handshake") >= 1,
        "over TLS"
    );
}
