//! EG's certificates, and the Deployment running as a process with the
//! servers it talks to.

use super::*;

// ------------------------------------------------------------ certificates

/// EG's certificates: one RSA CA, a leaf per component.
pub(crate) struct Pki {
    pub(crate) ca: Ca,
    /// EG's controller, the xDS server (with `localhost`, as in EG's host
    /// mode, for the loopback address).
    pub(crate) controller: Leaf,
    /// The rate-limit pod's Secret `envoy-rate-limit`.
    pub(crate) ratelimit: Leaf,
    /// The proxies' client certificate.
    pub(crate) envoy: Leaf,
}

/// Made once: RSA keys take a while.
impl Pki {
    /// EG's xDS server side of mutual TLS.
    pub(crate) fn xds_server_tls(&self) -> Arc<rustls::ServerConfig> {
        mutual_tls(
            &self.controller.cert_pem,
            &self.controller.key_pem,
            &self.ca.pem(),
        )
    }
}

pub(crate) static PKI: LazyLock<Pki> = LazyLock::new(|| {
    let ca = Ca::rsa("envoy-gateway");
    let wildcard = format!("*.{NAMESPACE}");
    let controller_names = [
        "envoy-gateway".to_string(),
        format!("envoy-gateway.{NAMESPACE}"),
        format!("envoy-gateway.{NAMESPACE}.svc"),
        format!("envoy-gateway.{NAMESPACE}.svc.cluster.local"),
        "localhost".to_string(),
    ];
    let controller_names: Vec<&str> = controller_names.iter().map(String::as_str).collect();
    Pki {
        controller: ca.eg_leaf("envoy-gateway", &controller_names),
        ratelimit: ca.eg_leaf("envoy", &[&wildcard]),
        envoy: ca.eg_leaf("envoy", &[&wildcard]),
        ca,
    }
});

// ------------------------------------------------------------ the pod

/// The Deployment running, with what it talks to.
pub(crate) struct Pod {
    pub(crate) management: Management,
    pub(crate) grpc: SocketAddr,
    pub(crate) http: SocketAddr,
    pub(crate) prometheus: SocketAddr,
    pub(crate) statsd: Option<StatsdListener>,
    pub(crate) process: Process,
    pub(crate) _redis: RedisServer,
    pub(crate) dir: tempfile::TempDir,
}

/// The files of the Secret or ConfigMap named `source`: EG's Secret
/// `envoy-rate-limit` and its statsd-exporter mapping.
pub(crate) fn volume_contents(pki: &Pki, source: &str) -> Vec<(&'static str, String)> {
    match source {
        "envoy-rate-limit" => vec![
            ("tls.crt", pki.ratelimit.cert_pem.clone()),
            ("tls.key", pki.ratelimit.key_pem.clone()),
            ("ca.crt", pki.ca.pem()),
        ],
        "statsd-exporter-config" => vec![(
            "conf.yaml",
            std::fs::read_to_string(fixture("eg_statsd_mapping.yaml")).unwrap(),
        )],
        other => panic!("no contents for volume source {other}"),
    }
}

impl Pod {
    pub(crate) async fn start(render: Render) -> Self {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let pki = &*PKI;
        let deployment = Deployment::load();
        deployment.check_entry_point();
        let redis = RedisServer::start();
        let management = Management::start(Some(pki.xds_server_tls())).await;
        let statsd = match render {
            Render::Default | Render::BothSinks => None,
            Render::V1_1Statsd => Some(StatsdListener::tcp().await),
        };
        let dir = tempfile::tempdir().unwrap();
        let mut env = render.env(&deployment);
        deployment.mount(&mut env, dir.path(), |source| volume_contents(pki, source));

        // The addresses.
        let (http, grpc, debug, prometheus) = (free_port(), free_port(), free_port(), free_port());
        let before = env.clone();
        set(
            &mut env,
            "CONFIG_GRPC_XDS_SERVER_URL",
            format!("localhost:{}", management.addr.port()),
        );
        set(&mut env, "REDIS_URL", format!("127.0.0.1:{}", redis.port()));
        if env.iter().any(|(n, _)| n == "PROMETHEUS_ADDR") {
            set(
                &mut env,
                "PROMETHEUS_ADDR",
                format!("127.0.0.1:{prometheus}"),
            );
        }
        if let Some(statsd) = &statsd {
            set(&mut env, "STATSD_PORT", statsd.addr.port().to_string());
        }
        for (name, value) in [
            ("HOST", "127.0.0.1".to_string()),
            ("PORT", http.to_string()),
            ("GRPC_HOST", "127.0.0.1".into()),
            ("GRPC_PORT", grpc.to_string()),
            ("DEBUG_HOST", "127.0.0.1".into()),
            ("DEBUG_PORT", debug.to_string()),
        ] {
            set(&mut env, name, value);
        }
        only_addresses_changed(&before, &env);

        let log = std::fs::File::create(dir.path().join("ratelimit.log")).unwrap();
        let child = Command::new(support::ratelimit_binary(dir.path()))
            .env_clear()
            .envs(env)
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("run ratelimit");
        Self {
            management,
            grpc: ([127, 0, 0, 1], grpc).into(),
            http: ([127, 0, 0, 1], http).into(),
            prometheus: ([127, 0, 0, 1], prometheus).into(),
            statsd,
            process: Process(child),
            _redis: redis,
            dir,
        }
    }

    /// The pod started, healthy, with `config` applied as version "1", and
    /// a channel to it as Envoy's.
    pub(crate) async fn serving(render: Render, config: RateLimitConfig) -> (Self, Channel) {
        let mut pod = Self::start(render).await;
        pod.probe(200).await;
        pod.apply("1", vec![config]).await;
        let channel = pod.envoy_channel().await;
        (pod, channel)
    }

    /// Waits for the probes' path to answer `status` on the HTTP port.
    pub(crate) async fn probe(&self, status: u16) -> String {
        let http = self.http;
        tokio::task::spawn_blocking(move || support::wait_for_http(http, "/healthcheck", status))
            .await
            .unwrap()
    }

    /// Serves `configs` as `version` and returns the pod's answer to it.
    pub(crate) async fn serve(
        &mut self,
        version: &str,
        configs: Vec<RateLimitConfig>,
    ) -> DiscoveryRequest {
        self.management.push(version, configs);
        let nonce = self.management.nonce_of(version).await;
        let answer = self.management.answer_to(&nonce).await;
        assert_eq!(answer.response_nonce, nonce);
        answer
    }

    /// Serves `configs` as `version` and checks that the pod ACKs it.
    pub(crate) async fn apply(&mut self, version: &str, configs: Vec<RateLimitConfig>) {
        let ack = self.serve(version, configs).await;
        assert_eq!(ack.version_info, version, "an ACK names the version");
        assert!(ack.error_detail.is_none(), "an ACK, not a NACK: {ack:?}");
    }

    /// A gRPC channel showing EG's Envoy certificate, as Envoy does.
    pub(crate) async fn envoy_channel(&self) -> Channel {
        let pki = &*PKI;
        let config = chain_only_client_config(&pki.ca, Some(&pki.envoy));
        channel(self.grpc, config)
            .await
            .expect("mTLS with EG's Envoy certificate")
            .0
    }
}

/// Checks that going from `before` to `after` changed nothing but addresses.
pub(crate) fn only_addresses_changed(before: &[(String, String)], after: &[(String, String)]) {
    for (name, _) in after.iter().filter(|e| !before.contains(e)) {
        assert!(
            name.ends_with("_HOST")
                || name.ends_with("_PORT")
                || name.ends_with("_URL")
                || ["HOST", "PORT", "PROMETHEUS_ADDR"].contains(&name.as_str()),
            "{name} is not an address"
        );
    }
}
