//! The Sluice workload, as Sluice would read it: the Deployment's
//! container through the binary's own parsers, and the named checks every
//! rendered or assembled overlay must pass.

use super::*;

/// Every setting name, from the settings struct itself.
pub(crate) fn setting_names() -> BTreeSet<String> {
    serde_json::to_value(Settings::default())
        .unwrap()
        .as_object()
        .unwrap()
        .keys()
        .cloned()
        .collect()
}

/// A value the test stands in for a Secret's content.
pub(crate) fn secret_placeholder(name: &str, key: &str) -> String {
    format!("from-secret-{name}-{key}")
}

/// Expands `$(VAR)` as the kubelet does: only variables defined earlier.
pub(crate) fn expand(text: &str, env: &BTreeMap<String, String>, label: &str) -> String {
    let mut out = String::new();
    let mut rest = text;
    while let Some(start) = rest.find("$(") {
        out.push_str(&rest[..start]);
        let end = rest[start..]
            .find(')')
            .unwrap_or_else(|| panic!("{label}: unclosed $( in {text:?}"));
        let name = &rest[start + 2..start + end];
        let value = env.get(name).unwrap_or_else(|| {
            panic!("{label}: $({name}) in {text:?} is not defined earlier in env, so the kubelet would leave it as is")
        });
        out.push_str(value);
        rest = &rest[start + end + 1..];
    }
    out.push_str(rest);
    out
}

/// The Sluice container of a rendered (or assembled) set of documents.
pub(crate) struct Workload<'a> {
    pub(crate) label: String,
    pub(crate) docs: &'a [Value],
    pub(crate) deployment: &'a Value,
    pub(crate) pod: &'a Value,
    pub(crate) container: &'a Value,
    /// The container's environment with `$(VAR)` expanded and Secrets
    /// replaced by placeholders.
    pub(crate) env: BTreeMap<String, String>,
    /// Names of variables that come from Secrets.
    pub(crate) secret_vars: BTreeSet<String>,
    /// The command line after the entrypoint.
    pub(crate) args: Vec<String>,
    pub(crate) settings: Settings,
}

impl<'a> Workload<'a> {
    pub(crate) fn new(label: &str, docs: &'a [Value]) -> Self {
        let deployment = find(docs, "Deployment", "sluice")
            .unwrap_or_else(|| panic!("{label}: no Deployment sluice"));
        let pod = &deployment["spec"]["template"]["spec"];
        let container = list(&pod["containers"])
            .iter()
            .find(|c| c["name"] == "sluice")
            .unwrap_or_else(|| panic!("{label}: no container sluice"));
        let mut env = BTreeMap::new();
        let mut secret_vars = BTreeSet::new();
        for var in list(&container["env"]) {
            let name = s(&var["name"], "env name").to_owned();
            let value = if let Some(value) = var["value"].as_str() {
                expand(value, &env, label)
            } else if let Some(secret) = var["valueFrom"]["secretKeyRef"].as_object() {
                secret_vars.insert(name.clone());
                secret_placeholder(s(&secret["name"], "secret"), s(&secret["key"], "key"))
            } else {
                panic!("{label}: env {name}: this test knows literal values and secretKeyRef only")
            };
            env.insert(name, value);
        }
        if let Some(command) = container.get("command") {
            assert_eq!(
                command,
                &json!([ENTRYPOINT]),
                "{label}: the command, when set, is the image's entrypoint"
            );
        }
        let args: Vec<String> = list(&container["args"])
            .iter()
            .map(|a| expand(s(a, "arg"), &env, label))
            .collect();
        let settings = settings_of(&args, &env, label);
        Self {
            label: label.to_owned(),
            docs,
            deployment,
            pod,
            container,
            env,
            secret_vars,
            args,
            settings,
        }
    }

    pub(crate) fn port(&self, name: &str) -> u16 {
        list(&self.container["ports"])
            .iter()
            .find(|p| p["name"] == name)
            .and_then(|p| p["containerPort"].as_u64())
            .unwrap_or_else(|| panic!("{}: no container port named {name}", self.label))
            as u16
    }

    /// A probe's or Service's port (a name or a number) as a number.
    pub(crate) fn resolve_port(&self, port: &Value) -> u16 {
        match port {
            Value::String(name) => self.port(name),
            Value::Number(n) => n.as_u64().unwrap() as u16,
            other => panic!("{}: bad port {other}", self.label),
        }
    }

    pub(crate) fn grpc_port(&self) -> u16 {
        self.port("grpc")
    }

    pub(crate) fn http_port(&self) -> u16 {
        self.port("http-admin")
    }

    pub(crate) fn pod_labels(&self) -> &Value {
        &self.deployment["spec"]["template"]["metadata"]["labels"]
    }

    /// The mount that holds the rules path, and the ConfigMap behind it.
    pub(crate) fn rules_mount(&self) -> (&Value, &str) {
        let rules = self.settings.rules.as_ref().unwrap_or_else(|| {
            panic!(
                "{}: no rules path set: Sluice would serve its built-in rules, not the ConfigMap",
                self.label
            )
        });
        let mount = list(&self.container["volumeMounts"])
            .iter()
            .find(|m| Path::new(s(&m["mountPath"], "mountPath")) == rules)
            .unwrap_or_else(|| {
                panic!(
                    "{}: the rules path {} is not a volume mount",
                    self.label,
                    rules.display()
                )
            });
        let volume = list(&self.pod["volumes"])
            .iter()
            .find(|v| v["name"] == mount["name"])
            .unwrap_or_else(|| panic!("{}: no volume {}", self.label, mount["name"]));
        let configmap = s(&volume["configMap"]["name"], "the rules volume's ConfigMap");
        (mount, configmap)
    }
}

/// `sluice ARGS…` through the binary's own parsers, with `env` as the
/// environment.
pub(crate) fn settings_of(
    args: &[String],
    env: &BTreeMap<String, String>,
    label: &str,
) -> Settings {
    let argv = std::iter::once("sluice".to_owned()).chain(args.iter().cloned());
    let cli = Cli::try_parse_from(argv)
        .unwrap_or_else(|e| panic!("{label}: sluice rejects the arguments {args:?}:\n{e}"));
    let SluiceCommand::Serve(serve) = cli.command else {
        panic!("{label}: the arguments {args:?} do not run `sluice serve`");
    };
    let env: config::Map<String, String> = env.clone().into_iter().collect();
    Settings::load_from(serve.config.as_deref(), &serve.flags, Some(env))
        .unwrap_or_else(|e| panic!("{label}: sluice rejects the settings: {e}"))
        .settings
}

/// Every check of the Sluice workload that needs no running process.
pub(crate) fn check_workload(w: &Workload) {
    check_environment(w);
    check_secrets(w);
    check_ports(w);
    check_probes(w);
    check_shutdown(w);
    check_rules_mount(w);
    check_security(w);
    check_resources(w);
    check_scheduling(w);
    check_services(w);
    check_disruption_policy_and_autoscaler(w);
    check_namespace(w);
}

/// Environment: real setting names only; helper variables feed one.
fn check_environment(w: &Workload) {
    let label = &w.label;
    let known = setting_names();
    for name in w.env.keys() {
        if let Some(setting) = name.strip_prefix("SLUICE_") {
            assert!(
                known.contains(&setting.to_lowercase()) || name == "SLUICE_CONFIG",
                "{label}: {name} is not a setting of sluice (known: {known:?})"
            );
        } else {
            let used = list(&w.container["env"]).iter().any(|v| {
                v["value"]
                    .as_str()
                    .is_some_and(|t| t.contains(&format!("$({name})")))
            });
            assert!(
                used,
                "{label}: {name} is neither a SLUICE_ setting nor used by one"
            );
        }
    }
}

/// Secrets reach the process through the environment only.
fn check_secrets(w: &Workload) {
    let label = &w.label;
    for arg in list(&w.container["args"]) {
        for secret in &w.secret_vars {
            assert!(
                !s(arg, "arg").contains(&format!("$({secret})")),
                "{label}: the argument {arg} would show the secret {secret} in the process list"
            );
        }
    }
    if let Some(url) = &w.settings.redis_url {
        let url = url.expose();
        if let Some((_, rest)) = url.split_once("://")
            && let Some((auth, _)) = rest.rsplit_once('@')
        {
            let password = auth.split_once(':').map_or(auth, |(_, p)| p);
            assert!(
                w.secret_vars.iter().any(|v| password == w.env[v]),
                "{label}: the Redis URL carries a password that does not come from a Secret"
            );
        }
    }
}

/// Ports: the containerPorts are where Sluice listens.
fn check_ports(w: &Workload) {
    let label = &w.label;
    assert_eq!(
        w.settings.grpc_addr.port(),
        w.grpc_port(),
        "{label}: gRPC listens on {} but the container port grpc is {}",
        w.settings.grpc_addr,
        w.grpc_port()
    );
    assert_eq!(
        w.settings.http_addr.port(),
        w.http_port(),
        "{label}: admin HTTP listens on {} but the container port http-admin is {}",
        w.settings.http_addr,
        w.http_port()
    );
    for addr in [w.settings.grpc_addr, w.settings.http_addr] {
        assert!(
            addr.ip().is_unspecified(),
            "{label}: {addr} is not reachable from outside the pod"
        );
    }
    assert_eq!(
        list(&w.container["ports"]).len(),
        2,
        "{label}: Sluice has exactly two ports"
    );
}

/// Probes.
fn check_probes(w: &Workload) {
    let label = &w.label;
    for (probe, path) in [
        ("startupProbe", LIVENESS_PATH),
        ("livenessProbe", LIVENESS_PATH),
        ("readinessProbe", READINESS_PATH),
    ] {
        let p = &w.container[probe];
        assert!(p.is_object(), "{label}: no {probe}");
        if let Some(get) = p["httpGet"].as_object() {
            assert_eq!(
                get["path"], path,
                "{label}: {probe} must use {path} (readiness is the one route that looks at the store and at shutdown)"
            );
            assert_eq!(
                w.resolve_port(&get["port"]),
                w.settings.http_addr.port(),
                "{label}: {probe} is not on the admin HTTP port"
            );
        } else if let Some(grpc) = p["grpc"].as_object() {
            assert_ne!(
                probe, "readinessProbe",
                "{label}: gRPC health does not reflect the store; readiness must use {READINESS_PATH}"
            );
            assert_eq!(
                w.resolve_port(&grpc["port"]),
                w.settings.grpc_addr.port(),
                "{label}: {probe} is not on the gRPC port"
            );
        } else {
            panic!("{label}: {probe} is neither httpGet nor grpc");
        }
    }
}

/// Shutdown: the kubelet must not SIGKILL before Sluice is done.
fn check_shutdown(w: &Workload) {
    let label = &w.label;
    let grace_s = w.pod["terminationGracePeriodSeconds"]
        .as_u64()
        .unwrap_or_else(|| panic!("{label}: terminationGracePeriodSeconds is not set"));
    let needed = w.settings.shutdown_delay_ms + w.settings.shutdown_grace_ms + SHUTDOWN_MARGIN_MS;
    assert!(
        grace_s * 1000 >= needed,
        "{label}: terminationGracePeriodSeconds {grace_s} s is less than shutdown_delay_ms {} + shutdown_grace_ms {} + a margin of {SHUTDOWN_MARGIN_MS} ms",
        w.settings.shutdown_delay_ms,
        w.settings.shutdown_grace_ms
    );
    assert!(
        w.settings.shutdown_delay_ms > 0,
        "{label}: without shutdown_delay_ms Sluice closes before the endpoint is removed"
    );
}

/// Rules: a directory mount of the ConfigMap (hot reload), valid rules.
fn check_rules_mount(w: &Workload) {
    let label = &w.label;
    let (mount, configmap) = w.rules_mount();
    assert!(
        mount.get("subPath").is_none(),
        "{label}: a subPath mount is never updated, so rules would not reload"
    );
    let configmap = find(w.docs, "ConfigMap", configmap)
        .unwrap_or_else(|| panic!("{label}: no ConfigMap {configmap}"));
    let rules = load_configmap(configmap, label);
    assert!(
        rules.domains().count() > 0,
        "{label}: the rules ConfigMap has no domain"
    );
}

/// Security.
fn check_security(w: &Workload) {
    let label = &w.label;
    let pod_sc = &w.pod["securityContext"];
    let sc = &w.container["securityContext"];
    assert!(
        pod_sc["runAsNonRoot"] == true || sc["runAsNonRoot"] == true,
        "{label}: runAsNonRoot is not set"
    );
    assert_eq!(
        sc["readOnlyRootFilesystem"], true,
        "{label}: readOnlyRootFilesystem"
    );
    assert_eq!(
        sc["allowPrivilegeEscalation"], false,
        "{label}: allowPrivilegeEscalation"
    );
    assert_eq!(
        sc["capabilities"]["drop"],
        json!(["ALL"]),
        "{label}: capabilities"
    );
    let uid = sc["runAsUser"]
        .as_u64()
        .or(pod_sc["runAsUser"].as_u64())
        .unwrap_or_else(|| panic!("{label}: runAsUser is not set"));
    assert_eq!(
        uid.to_string(),
        dockerfile().user.split(':').next().unwrap(),
        "{label}: the pod runs as another user than the image's USER"
    );
    assert_eq!(
        w.pod["enableServiceLinks"], false,
        "{label}: enableServiceLinks"
    );
    assert_eq!(
        w.pod["automountServiceAccountToken"], false,
        "{label}: automountServiceAccountToken"
    );
    let account = s(&w.pod["serviceAccountName"], "serviceAccountName");
    assert!(
        find(w.docs, "ServiceAccount", account).is_some(),
        "{label}: no ServiceAccount {account}"
    );
}

/// Resources: requests and limits for CPU and memory.
fn check_resources(w: &Workload) {
    let label = &w.label;
    for kind in ["requests", "limits"] {
        for resource in ["cpu", "memory"] {
            assert!(
                w.container["resources"][kind][resource].is_string(),
                "{label}: resources.{kind}.{resource} is not set"
            );
        }
    }
}

/// Scheduling: the spreading rules select this Deployment's pods.
fn check_scheduling(w: &Workload) {
    let label = &w.label;
    let labels = w.pod_labels();
    assert!(
        selects(&w.deployment["spec"]["selector"]["matchLabels"], labels),
        "{label}: the Deployment's selector does not match its pods"
    );
    let spread = list(&w.pod["topologySpreadConstraints"]);
    assert!(!spread.is_empty(), "{label}: no topologySpreadConstraints");
    let anti = list(
        &w.pod["affinity"]["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"],
    );
    assert!(!anti.is_empty(), "{label}: no pod anti-affinity");
    for selector in spread
        .iter()
        .map(|c| &c["labelSelector"]["matchLabels"])
        .chain(
            anti.iter()
                .map(|a| &a["podAffinityTerm"]["labelSelector"]["matchLabels"]),
        )
    {
        assert!(
            selects(selector, labels),
            "{label}: {selector} does not select Sluice's pods"
        );
    }
}

/// Services: ports named for protocol detection, pointing at Sluice's.
fn check_services(w: &Workload) {
    let label = &w.label;
    let labels = w.pod_labels();
    let services: Vec<&Value> = of_kind(w.docs, "Service")
        .filter(|svc| selects(&svc["spec"]["selector"], labels))
        .collect();
    assert!(
        services
            .iter()
            .any(|svc| svc["metadata"]["name"] == "sluice"),
        "{label}: no Service sluice for the pods"
    );
    for svc in &services {
        let name = &svc["metadata"]["name"];
        for port in list(&svc["spec"]["ports"]) {
            let target = w.resolve_port(&port["targetPort"]);
            let (prefix, protocol) = if target == w.settings.grpc_addr.port() {
                ("grpc", "grpc")
            } else if target == w.settings.http_addr.port() {
                ("http", "http")
            } else {
                panic!("{label}: Service {name} port {port} is neither of Sluice's ports")
            };
            let port_name = s(&port["name"], "Service port name");
            assert!(
                port_name == prefix || port_name.starts_with(&format!("{prefix}-")),
                "{label}: Service {name} port {port_name} should be named {prefix} or {prefix}-… for protocol detection"
            );
            assert_eq!(
                port["appProtocol"], protocol,
                "{label}: Service {name} port {port_name} appProtocol"
            );
        }
    }
}

/// Disruption budget, network policy, autoscaler: aimed at these pods.
fn check_disruption_policy_and_autoscaler(w: &Workload) {
    let label = &w.label;
    let labels = w.pod_labels();
    let pdb = of_kind(w.docs, "PodDisruptionBudget")
        .find(|p| selects(&p["spec"]["selector"]["matchLabels"], labels))
        .unwrap_or_else(|| panic!("{label}: no PodDisruptionBudget for the pods"));
    assert!(
        pdb["spec"]["maxUnavailable"].is_number(),
        "{label}: the PodDisruptionBudget uses maxUnavailable, so one replica can still be drained"
    );
    let policy = of_kind(w.docs, "NetworkPolicy")
        .find(|p| selects(&p["spec"]["podSelector"]["matchLabels"], labels))
        .unwrap_or_else(|| panic!("{label}: no NetworkPolicy for the pods"));
    let mut allowed = BTreeSet::new();
    for rule in list(&policy["spec"]["ingress"]) {
        for port in list(&rule["ports"]) {
            allowed.insert(w.resolve_port(&port["port"]));
        }
    }
    assert!(
        allowed.contains(&w.settings.grpc_addr.port()),
        "{label}: the NetworkPolicy does not admit gRPC"
    );
    for hpa in of_kind(w.docs, "HorizontalPodAutoscaler") {
        assert_eq!(
            hpa["spec"]["scaleTargetRef"]["name"], w.deployment["metadata"]["name"],
            "{label}: the autoscaler scales another Deployment"
        );
    }
}

/// Every namespaced object lands in one namespace.
fn check_namespace(w: &Workload) {
    let label = &w.label;
    let namespaces: BTreeSet<&str> = w
        .docs
        .iter()
        .filter(|d| d["kind"] != "Namespace")
        .map(|d| d["metadata"]["namespace"].as_str().unwrap_or("<none>"))
        .collect();
    assert_eq!(
        namespaces.len(),
        1,
        "{label}: objects in several namespaces: {namespaces:?}"
    );
}

/// What an overlay (not the base, which leaves the store to them) must get
/// right about replicas: in-memory counters are per pod, so one pod and no
/// autoscaler; shared counters may scale.
pub(crate) fn check_replicas_fit_the_store(w: &Workload) {
    let label = &w.label;
    if w.settings.redis_url.is_none() {
        assert_eq!(
            w.deployment["spec"]["replicas"], 1,
            "{label}: in-memory counters need exactly one replica"
        );
        assert_eq!(
            of_kind(w.docs, "HorizontalPodAutoscaler").count(),
            0,
            "{label}: an autoscaler on in-memory counters multiplies every limit by the replica count"
        );
    } else {
        assert!(
            w.deployment["spec"]["replicas"].is_null(),
            "{label}: with shared counters the autoscaler owns the replica count"
        );
        assert_eq!(
            of_kind(w.docs, "HorizontalPodAutoscaler").count(),
            1,
            "{label}: shared counters scale with an autoscaler"
        );
    }
}

/// A ConfigMap's rules, loaded by Sluice from a directory laid out as the
/// kubelet does (`..data` symlink to a timestamped directory).
pub(crate) fn load_configmap(configmap: &Value, label: &str) -> RuleSet {
    let dir = tempfile::tempdir().unwrap();
    lay_out_configmap(configmap, dir.path());
    load_paths(&[dir.path().to_path_buf()])
        .unwrap_or_else(|errors| panic!("{label}: the rules ConfigMap does not load: {errors:#?}"))
}

pub(crate) fn lay_out_configmap(configmap: &Value, root: &Path) {
    use std::os::unix::fs::symlink;
    let data = configmap["data"]
        .as_object()
        .expect("a ConfigMap with data");
    let stamp = root.join("..2026_01_01_00_00_00.000000001");
    std::fs::create_dir_all(&stamp).unwrap();
    for (key, text) in data {
        assert!(
            key.ends_with(".yaml") || key.ends_with(".yml"),
            "ConfigMap key {key}: Sluice loads only *.yaml and *.yml files"
        );
        std::fs::write(stamp.join(key), s(text, "ConfigMap data")).unwrap();
        symlink(format!("..data/{key}"), root.join(key)).unwrap();
    }
    symlink(stamp.file_name().unwrap(), root.join("..data")).unwrap();
}
