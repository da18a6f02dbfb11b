//! Kubernetes: rendered overlays (need kubectl).

use super::*;

#[test]
fn every_overlay_renders_and_matches_the_binary() {
    if !need_kubectl("every_overlay_renders_and_matches_the_binary") {
        return;
    }
    let names = overlay_names();
    assert_eq!(names, ["memory", "redis", "redis-cluster"]);
    check_workload(&Workload::new(
        "base",
        &kustomize(&deploy("kubernetes/base")),
    ));
    for overlay in names {
        let docs = rendered(&overlay);
        let w = Workload::new(&overlay, &docs);
        check_workload(&w);
        check_replicas_fit_the_store(&w);
        let image = s(&w.container["image"], "image");
        assert_eq!(
            image,
            format!("sluice:{}", env!("CARGO_PKG_VERSION")),
            "{overlay}: image"
        );
    }
}

#[test]
fn the_memory_overlay_runs_one_replica_without_redis_or_autoscaler() {
    let docs = overlay_docs("memory");
    let w = Workload::new("memory", &docs);
    assert!(w.settings.redis_url.is_none());
    assert_eq!(w.deployment["spec"]["replicas"], 1);
    assert_eq!(of_kind(&docs, "HorizontalPodAutoscaler").count(), 0);
}

#[test]
fn the_redis_overlay_points_at_its_own_redis_service() {
    let docs = overlay_docs("redis");
    let w = Workload::new("redis", &docs);
    let url = w.settings.redis_url.as_ref().expect("a Redis URL").expose();
    let host_port = url
        .strip_prefix("redis://")
        .expect("a single Redis: redis://");
    let (host, port) = host_port.split_once(':').expect("host:port");
    let svc = find(&docs, "Service", host)
        .unwrap_or_else(|| panic!("the URL's host {host} is not a Service of the overlay"));
    let svc_port = list(&svc["spec"]["ports"])
        .iter()
        .find(|p| p["port"].as_u64() == port.parse().ok())
        .unwrap_or_else(|| panic!("Service {host} has no port {port}"));
    let redis = of_kind(&docs, "Deployment")
        .find(|d| {
            selects(
                &svc["spec"]["selector"],
                &d["spec"]["template"]["metadata"]["labels"],
            )
        })
        .expect("a Deployment behind the Redis Service");
    let container = &redis["spec"]["template"]["spec"]["containers"][0];
    let target = &svc_port["targetPort"];
    assert!(
        list(&container["ports"])
            .iter()
            .any(|p| p["name"] == *target || p["containerPort"] == *target),
        "the Redis Service's targetPort {target} is not a port of the Redis container"
    );
    assert_eq!(
        svc["metadata"]["namespace"], w.deployment["metadata"]["namespace"],
        "Redis and Sluice share a namespace, so the short host name resolves"
    );
    // Only Sluice may reach it.
    let policy = of_kind(&docs, "NetworkPolicy")
        .find(|p| {
            selects(
                &p["spec"]["podSelector"]["matchLabels"],
                &redis["spec"]["template"]["metadata"]["labels"],
            )
        })
        .expect("a NetworkPolicy for Redis");
    for rule in list(&policy["spec"]["ingress"]) {
        for from in list(&rule["from"]) {
            assert!(
                selects(&from["podSelector"]["matchLabels"], w.pod_labels()),
                "Redis admits more than Sluice: {from}"
            );
        }
    }
}

#[test]
fn the_redis_cluster_overlay_takes_its_password_from_a_secret() {
    let docs = overlay_docs("redis-cluster");
    let w = Workload::new("redis-cluster", &docs);
    let url = w.settings.redis_url.as_ref().expect("a Redis URL").expose();
    assert!(url.starts_with("redis-cluster://"), "{url}");
    assert!(
        !url.contains('@'),
        "the password belongs in SLUICE_REDIS_PASSWORD, not in the URL: {url}"
    );
    assert!(
        w.secret_vars.contains("SLUICE_REDIS_PASSWORD"),
        "SLUICE_REDIS_PASSWORD does not come from a Secret: {:?}",
        w.secret_vars
    );
    let password = w
        .settings
        .redis_password
        .as_ref()
        .expect("a Redis password");
    assert_eq!(password.expose(), w.env["SLUICE_REDIS_PASSWORD"]);
    // The Secret is created by the operator, not shipped.
    assert_eq!(of_kind(&docs, "Secret").count(), 0);
}

#[tokio::test]
async fn the_redis_urls_of_the_overlays_are_accepted_by_the_redis_store() {
    // Rendered when kubectl is there, merged from the files otherwise.
    for overlay in overlay_names() {
        let docs = overlay_docs(&overlay);
        let w = Workload::new(&overlay, &docs);
        let Some(redis) = sluice::app::build::redis(&w.settings) else {
            continue;
        };
        // An invalid URL fails at once; a valid one to an unreachable host
        // waits at most the connect timeout and starts anyway.
        let store = sluice::store::RedisStore::connect(
            &redis,
            std::sync::Arc::new(sluice::limiter::SystemClock),
            Duration::from_millis(100),
        )
        .await
        .unwrap_or_else(|e| panic!("{overlay}: the Redis store rejects the URL: {e}"));
        // Dropped, not quit: quitting waits for a connection that the
        // unreachable host never gives.
        drop(store);
    }
}

#[test]
fn the_monitoring_component_scrapes_the_admin_port() {
    if !need_kubectl("the_monitoring_component_scrapes_the_admin_port") {
        return;
    }
    for overlay in overlay_names() {
        let docs = rendered_with_monitoring(&overlay);
        let w = Workload::new(&format!("{overlay} + monitoring"), &docs);
        check_workload(&w);
        check_replicas_fit_the_store(&w);
        let monitor = of_kind(&docs, "PodMonitor").next().expect("a PodMonitor");
        assert!(selects(
            &monitor["spec"]["selector"]["matchLabels"],
            w.pod_labels()
        ));
        let endpoint = &monitor["spec"]["podMetricsEndpoints"][0];
        assert_eq!(
            w.resolve_port(&endpoint["port"]),
            w.settings.http_addr.port()
        );
        assert_eq!(endpoint["path"], "/metrics");
        // Prometheus may reach the admin port.
        let policy = find(&docs, "NetworkPolicy", "sluice").unwrap();
        assert!(
            list(&policy["spec"]["ingress"]).iter().any(|rule| {
                list(&rule["ports"])
                    .iter()
                    .any(|p| w.resolve_port(&p["port"]) == w.settings.http_addr.port())
                    && list(&rule["from"])
                        .iter()
                        .any(|f| f["namespaceSelector"]["matchLabels"].is_object())
            }),
            "{overlay}: the NetworkPolicy does not admit Prometheus to the admin port"
        );
    }
}
