//! deploy/envoy-gateway: Envoy Gateway's rate-limit Deployment run with
//! Sluice's image, by Helm values or by EG's own configuration.

use super::*;

/// The `EnvoyGateway` configuration of the Helm values and of the ConfigMap.
fn eg_configs() -> [(&'static str, Value); 2] {
    let values = &yaml_file(&deploy("envoy-gateway/values.yaml"))[0];
    let helm = values["config"]["envoyGateway"].clone();
    let configmap = &yaml_file(&deploy("envoy-gateway/envoy-gateway-config.yaml"))[0];
    assert_eq!(configmap["kind"], "ConfigMap");
    assert_eq!(configmap["metadata"]["name"], "envoy-gateway-config");
    assert_eq!(configmap["metadata"]["namespace"], "envoy-gateway-system");
    let text = s(
        &configmap["data"]["envoy-gateway.yaml"],
        "envoy-gateway.yaml",
    );
    let own = yaml_docs(text, "envoy-gateway-config.yaml's envoy-gateway.yaml")[0].clone();
    assert_eq!(own["kind"], "EnvoyGateway");
    assert_eq!(own["apiVersion"], "gateway.envoyproxy.io/v1alpha1");
    [("values.yaml", helm), ("envoy-gateway-config.yaml", own)]
}

#[test]
fn envoy_gateways_rate_limit_image_is_sluices_with_a_redis_backend() {
    let image = format!("sluice:{}", env!("CARGO_PKG_VERSION"));
    for (file, config) in eg_configs() {
        let kubernetes = &config["provider"]["kubernetes"];
        assert_eq!(config["provider"]["type"], "Kubernetes", "{file}");
        assert_eq!(
            kubernetes["rateLimitDeployment"]["container"]["image"], image,
            "{file}: the rate-limit image is the one deploy/Dockerfile builds"
        );
        let backend = &config["rateLimit"]["backend"];
        assert_eq!(backend["type"], "Redis", "{file}");
        let url = s(&backend["redis"]["url"], "rateLimit.backend.redis.url");
        // EG passes it on as REDIS_URL, host:port with no scheme.
        assert!(
            !url.contains("://")
                && url
                    .rsplit_once(':')
                    .is_some_and(|(_, p)| p.parse::<u16>().is_ok()),
            "{file}: {url} is not host:port"
        );
    }
}

#[test]
fn the_envoy_gateway_guide_names_its_files_and_the_entry_point() {
    let guide = read(&deploy("envoy-gateway/README.md"));
    for needed in [
        "(values.yaml)",
        "(envoy-gateway-config.yaml)",
        "/bin/ratelimit",
        "rateLimitDeployment.container.image",
    ] {
        assert!(
            guide.contains(needed),
            "deploy/envoy-gateway/README.md lacks {needed}"
        );
    }
    let entry = format!("ln -s {ENTRYPOINT} ");
    assert!(
        dockerfile().run.iter().any(|r| r.contains(&entry)),
        "the image the guide promises has no /bin/ratelimit link"
    );
}
