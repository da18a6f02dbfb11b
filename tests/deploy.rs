//! `deploy/` agrees with the binary.
//!
//! The Kubernetes manifests are read as an operator would: the container's
//! arguments and environment go through Sluice's own command-line and
//! settings parsers, and the ports, probes, rules mount, security settings
//! and shutdown timing are compared with the settings that result. The
//! binary is then started with each overlay's pod spec, the ConfigMap laid
//! out as the kubelet does, and its probes, gRPC health and staged shutdown
//! are exercised (against a local Redis or Redis Cluster standing in for the
//! overlay's).
//!
//! The overlays are rendered with `kubectl kustomize` when kubectl is
//! installed. Without it, the tests assemble each overlay from its files
//! (resources, generated ConfigMap, strategic-merge and delete patches,
//! namespace) and run the same checks; only the tests of kustomize's own
//! rendering say they were skipped.
//!
//! The Envoy configuration and the Istio EnvoyFilter are checked for the
//! cluster name, port, HTTP/2, domain and timeout, and the descriptors their
//! route actions produce for a sample request are run through the example
//! rules: each must get a limit. A real Envoy (named by `SLUICE_TEST_ENVOY`,
//! which `tests/run` sets after installing Envoy 1.40 when it is missing, or
//! `envoy` on PATH) validates both files, and the front proxy is run in front
//! of Sluice to see a request limited.
//!
//! The Dockerfile is checked for its ports, user, entrypoint and command
//! against the binary, and for the paths it copies. The README is checked
//! for the facts an operator copies from it: every setting, every metric,
//! every overlay, and a two-command quick start.

mod support;

use std::collections::{BTreeMap, BTreeSet};
use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use clap::Parser as _;
use serde_json::{Value, json};
use sluice::cli::{Cli, Command as SluiceCommand};
use sluice::request::Entry;
use sluice::rules::{RuleSet, load_paths};
use sluice::settings::Settings;
use yaml_rust2::{Yaml, YamlLoader};

use support::envoy::envoy_binary;
use support::redis::{RedisCluster, RedisServer};
use support::{Process, http};

/// Seconds that `terminationGracePeriodSeconds` must leave beyond Sluice's
/// own shutdown (delay + grace) before the kubelet's SIGKILL.
const SHUTDOWN_MARGIN_MS: u64 = 5_000;

/// The admin routes a probe may use, and what each is for.
const LIVENESS_PATH: &str = "/healthz";
const READINESS_PATH: &str = "/readyz";

/// The image's entrypoint (deploy/Dockerfile).
const ENTRYPOINT: &str = "/sluice";

// ---------------------------------------------------------------------------
// Files and YAML
// ---------------------------------------------------------------------------

fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn deploy(rel: &str) -> PathBuf {
    repo().join("deploy").join(rel)
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// YAML as JSON values, which are easier to walk.
fn to_json(yaml: &Yaml) -> Value {
    match yaml {
        Yaml::Real(text) => json!(text.parse::<f64>().expect("a YAML real is a number")),
        Yaml::Integer(n) => json!(n),
        Yaml::String(s) => json!(s),
        Yaml::Boolean(b) => json!(b),
        Yaml::Array(items) => Value::Array(items.iter().map(to_json).collect()),
        Yaml::Hash(map) => Value::Object(
            map.iter()
                .map(|(k, v)| {
                    let key = match to_json(k) {
                        Value::String(s) => s,
                        other => other.to_string(),
                    };
                    (key, to_json(v))
                })
                .collect(),
        ),
        Yaml::Null => Value::Null,
        Yaml::Alias(_) | Yaml::BadValue => panic!("unsupported YAML node {yaml:?}"),
    }
}

fn yaml_docs(text: &str, label: &str) -> Vec<Value> {
    YamlLoader::load_from_str(text)
        .unwrap_or_else(|e| panic!("{label}: invalid YAML: {e}"))
        .iter()
        .map(to_json)
        .filter(|doc| !doc.is_null())
        .collect()
}

fn yaml_file(path: &Path) -> Vec<Value> {
    yaml_docs(&read(path), &path.display().to_string())
}

/// Every `*.yaml` / `*.yml` file below `dir`, sorted.
fn yaml_files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                stack.push(path);
            } else if matches!(
                path.extension().and_then(|e| e.to_str()),
                Some("yaml" | "yml")
            ) {
                out.push(path);
            }
        }
    }
    out.sort();
    out
}

fn s<'a>(value: &'a Value, what: &str) -> &'a str {
    value
        .as_str()
        .unwrap_or_else(|| panic!("{what}: expected a string, got {value}"))
}

fn list(value: &Value) -> &[Value] {
    value.as_array().map_or(&[], Vec::as_slice)
}

fn find<'a>(docs: &'a [Value], kind: &str, name: &str) -> Option<&'a Value> {
    docs.iter()
        .find(|d| d["kind"] == kind && d["metadata"]["name"] == name)
}

fn of_kind<'a>(docs: &'a [Value], kind: &'a str) -> impl Iterator<Item = &'a Value> + 'a {
    docs.iter().filter(move |d| d["kind"] == kind)
}

/// Whether every `matchLabels` pair is among `labels`.
fn selects(selector: &Value, labels: &Value) -> bool {
    let Some(wanted) = selector.as_object() else {
        return false;
    };
    !wanted.is_empty() && wanted.iter().all(|(k, v)| labels[k] == *v)
}

// ---------------------------------------------------------------------------
// Rendering
// ---------------------------------------------------------------------------

/// `kubectl`, or the program `SLUICE_TEST_KUBECTL` names (a missing one
/// shows what runs without kubectl).
fn kubectl() -> PathBuf {
    std::env::var_os("SLUICE_TEST_KUBECTL").map_or_else(|| PathBuf::from("kubectl"), PathBuf::from)
}

fn kubectl_available() -> bool {
    static FOUND: OnceLock<bool> = OnceLock::new();
    *FOUND.get_or_init(|| {
        Command::new(kubectl())
            .args(["version", "--client"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    })
}

/// Says why a test that needs kubectl did nothing, and returns whether it may
/// go on.
fn need_kubectl(test: &str) -> bool {
    if !kubectl_available() {
        eprintln!(
            "{test}: skipped, kubectl is not installed (the checks on the files themselves still ran)"
        );
    }
    kubectl_available()
}

fn kustomize(dir: &Path) -> Vec<Value> {
    let out = Command::new(kubectl())
        .arg("kustomize")
        .arg(dir)
        .output()
        .expect("run kubectl");
    assert!(
        out.status.success(),
        "kubectl kustomize {} failed:\n{}",
        dir.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    yaml_docs(
        &String::from_utf8(out.stdout).expect("UTF-8 output"),
        &dir.display().to_string(),
    )
}

fn overlay_names() -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(deploy("kubernetes/overlays"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

/// `kubectl kustomize` of an overlay.
fn rendered(overlay: &str) -> Vec<Value> {
    kustomize(&deploy(&format!("kubernetes/overlays/{overlay}")))
}

/// A relative path from `from` to `to` (kustomize refuses absolute ones).
fn relative(from: &Path, to: &Path) -> PathBuf {
    let depth = from.components().count() - 1;
    let mut out = PathBuf::new();
    for _ in 0..depth {
        out.push("..");
    }
    out.join(to.strip_prefix("/").expect("an absolute path"))
}

/// The overlay with the monitoring component added, as its README says.
fn rendered_with_monitoring(overlay: &str) -> Vec<Value> {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().canonicalize().unwrap();
    let to = |rel: &str| relative(&root, &deploy(rel)).display().to_string();
    std::fs::write(
        root.join("kustomization.yaml"),
        format!(
            "resources:\n  - {}\ncomponents:\n  - {}\n",
            to(&format!("kubernetes/overlays/{overlay}")),
            to("kubernetes/components/monitoring")
        ),
    )
    .unwrap();
    kustomize(&root)
}

/// The base assembled from its files without kubectl: its resources, the
/// ConfigMaps of its configMapGenerator, and its namespace.
fn base_from_files() -> Vec<Value> {
    let dir = deploy("kubernetes/base");
    let kustomization = &yaml_file(&dir.join("kustomization.yaml"))[0];
    let mut docs: Vec<Value> = list(&kustomization["resources"])
        .iter()
        .flat_map(|r| yaml_file(&dir.join(s(r, "resource"))))
        .collect();
    for generator in list(&kustomization["configMapGenerator"]) {
        let mut data = serde_json::Map::new();
        for file in list(&generator["files"]) {
            let file = s(file, "generator file");
            let (key, path) = file.split_once('=').unwrap_or_else(|| {
                let name = Path::new(file).file_name().unwrap().to_str().unwrap();
                (name, file)
            });
            data.insert(key.into(), json!(read(&dir.join(path))));
        }
        assert_eq!(
            generator["options"]["disableNameSuffixHash"], true,
            "the rules ConfigMap keeps its name, so updates land in place (hot reload)"
        );
        docs.push(json!({"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": generator["name"]}, "data": data}));
    }
    if let Some(ns) = kustomization["namespace"].as_str() {
        for doc in docs.iter_mut().filter(|d| d["kind"] != "Namespace") {
            doc["metadata"]["namespace"] = json!(ns);
        }
    }
    docs
}

/// An overlay without kubectl: its resources (the base assembled from its
/// files, and its own files), its Deployment patches merged the way a
/// strategic merge does for what these tests read (lists of named items
/// merged by name, other fields replaced), its `$patch: delete` patches
/// applied, and its namespace.
fn overlay_from_files(overlay: &str) -> Vec<Value> {
    let dir = deploy(&format!("kubernetes/overlays/{overlay}"));
    let kustomization = &yaml_file(&dir.join("kustomization.yaml"))[0];
    let mut docs = Vec::new();
    for resource in list(&kustomization["resources"]) {
        let resource = s(resource, "resource");
        if resource == "../../base" {
            docs.extend(base_from_files());
        } else {
            docs.extend(yaml_file(&dir.join(resource)));
        }
    }
    for patch in list(&kustomization["patches"]) {
        let patch_docs = match (patch["path"].as_str(), patch["patch"].as_str()) {
            (Some(path), _) => yaml_file(&dir.join(path)),
            (None, Some(inline)) => yaml_docs(inline, overlay),
            _ => panic!("{overlay}: a patch without path or patch"),
        };
        for patch in patch_docs {
            let (kind, name) = (&patch["kind"], &patch["metadata"]["name"]);
            let at = docs
                .iter()
                .position(|d| d["kind"] == *kind && d["metadata"]["name"] == *name)
                .unwrap_or_else(|| panic!("{overlay}: the patch targets no {kind} {name}"));
            if patch["$patch"] == "delete" {
                docs.remove(at);
            } else {
                merge(&mut docs[at], &patch);
            }
        }
    }
    if let Some(ns) = kustomization["namespace"].as_str() {
        for doc in docs.iter_mut().filter(|d| d["kind"] != "Namespace") {
            doc["metadata"]["namespace"] = json!(ns);
        }
    }
    docs
}

/// An overlay as `kubectl kustomize` renders it, or assembled from its
/// files when kubectl is not installed.
fn overlay_docs(overlay: &str) -> Vec<Value> {
    if kubectl_available() {
        rendered(overlay)
    } else {
        overlay_from_files(overlay)
    }
}

fn merge(target: &mut Value, patch: &Value) {
    match (target, patch) {
        (Value::Object(t), Value::Object(p)) => {
            for (k, v) in p {
                merge(t.entry(k.clone()).or_insert(Value::Null), v);
            }
        }
        (Value::Array(t), Value::Array(p)) if p.iter().all(|i| i["name"].is_string()) => {
            for item in p {
                match t.iter_mut().find(|i| i["name"] == item["name"]) {
                    Some(existing) => merge(existing, item),
                    None => t.push(item.clone()),
                }
            }
        }
        (t, p) => *t = p.clone(),
    }
}

// ---------------------------------------------------------------------------
// The Sluice workload, as Sluice would read it
// ---------------------------------------------------------------------------

/// Every setting name, from the settings struct itself.
fn setting_names() -> BTreeSet<String> {
    serde_json::to_value(Settings::default())
        .unwrap()
        .as_object()
        .unwrap()
        .keys()
        .cloned()
        .collect()
}

/// A value the test stands in for a Secret's content.
fn secret_placeholder(name: &str, key: &str) -> String {
    format!("from-secret-{name}-{key}")
}

/// Expands `$(VAR)` as the kubelet does: only variables defined earlier.
fn expand(text: &str, env: &BTreeMap<String, String>, label: &str) -> String {
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
struct Workload<'a> {
    label: String,
    docs: &'a [Value],
    deployment: &'a Value,
    pod: &'a Value,
    container: &'a Value,
    /// The container's environment with `$(VAR)` expanded and Secrets
    /// replaced by placeholders.
    env: BTreeMap<String, String>,
    /// Names of variables that come from Secrets.
    secret_vars: BTreeSet<String>,
    /// The command line after the entrypoint.
    args: Vec<String>,
    settings: Settings,
}

impl<'a> Workload<'a> {
    fn new(label: &str, docs: &'a [Value]) -> Self {
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

    fn port(&self, name: &str) -> u16 {
        list(&self.container["ports"])
            .iter()
            .find(|p| p["name"] == name)
            .and_then(|p| p["containerPort"].as_u64())
            .unwrap_or_else(|| panic!("{}: no container port named {name}", self.label))
            as u16
    }

    /// A probe's or Service's port (a name or a number) as a number.
    fn resolve_port(&self, port: &Value) -> u16 {
        match port {
            Value::String(name) => self.port(name),
            Value::Number(n) => n.as_u64().unwrap() as u16,
            other => panic!("{}: bad port {other}", self.label),
        }
    }

    fn grpc_port(&self) -> u16 {
        self.port("grpc")
    }

    fn http_port(&self) -> u16 {
        self.port("http-admin")
    }

    fn pod_labels(&self) -> &Value {
        &self.deployment["spec"]["template"]["metadata"]["labels"]
    }

    /// The mount that holds the rules path, and the ConfigMap behind it.
    fn rules_mount(&self) -> (&Value, &str) {
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
fn settings_of(args: &[String], env: &BTreeMap<String, String>, label: &str) -> Settings {
    let argv = std::iter::once("sluice".to_owned()).chain(args.iter().cloned());
    let cli = Cli::try_parse_from(argv)
        .unwrap_or_else(|e| panic!("{label}: sluice rejects the arguments {args:?}:\n{e}"));
    let SluiceCommand::Serve(serve) = cli.command else {
        panic!("{label}: the arguments {args:?} do not run `sluice serve`");
    };
    let env: config::Map<String, String> = env.clone().into_iter().collect();
    Settings::load_from(serve.config.as_deref(), &serve.flags, Some(env))
        .unwrap_or_else(|e| panic!("{label}: sluice rejects the settings: {e}"))
}

/// Every check of the Sluice workload that needs no running process.
fn check_workload(w: &Workload) {
    let label = &w.label;
    let known = setting_names();

    // Environment: real setting names only; helper variables feed one.
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
    // Secrets reach the process through the environment only.
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

    // Ports: the containerPorts are where Sluice listens.
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

    // Probes.
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

    // Shutdown: the kubelet must not SIGKILL before Sluice is done.
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

    // Rules: a directory mount of the ConfigMap (hot reload), valid rules.
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

    // Security.
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

    // Resources: requests and limits for CPU and memory.
    for kind in ["requests", "limits"] {
        for resource in ["cpu", "memory"] {
            assert!(
                w.container["resources"][kind][resource].is_string(),
                "{label}: resources.{kind}.{resource} is not set"
            );
        }
    }

    // Scheduling: the spreading rules select this Deployment's pods.
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

    // Services: ports named for protocol detection, pointing at Sluice's.
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

    // Disruption budget, network policy, autoscaler: aimed at these pods.
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

    // Every namespaced object lands in one namespace.
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
fn check_replicas_fit_the_store(w: &Workload) {
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
fn load_configmap(configmap: &Value, label: &str) -> RuleSet {
    let dir = tempfile::tempdir().unwrap();
    lay_out_configmap(configmap, dir.path());
    load_paths(&[dir.path().to_path_buf()])
        .unwrap_or_else(|errors| panic!("{label}: the rules ConfigMap does not load: {errors:#?}"))
}

fn lay_out_configmap(configmap: &Value, root: &Path) {
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

// ---------------------------------------------------------------------------
// Kubernetes: tests on the files (always run)
// ---------------------------------------------------------------------------

#[test]
fn every_yaml_file_in_deploy_parses() {
    let files = yaml_files(&repo().join("deploy"));
    assert!(files.len() >= 10, "found only {files:?}");
    for file in files {
        let docs = yaml_file(&file);
        assert!(!docs.is_empty(), "{}: no document", file.display());
    }
}

#[test]
fn the_base_assembled_from_its_files_matches_the_binary() {
    let docs = base_from_files();
    check_workload(&Workload::new("base (files)", &docs));
}

#[test]
fn every_overlay_assembled_from_its_files_matches_the_binary() {
    let names = overlay_names();
    assert_eq!(names, ["memory", "redis", "redis-cluster"]);
    for overlay in names {
        let docs = overlay_from_files(&overlay);
        let w = Workload::new(&format!("{overlay} (files)"), &docs);
        check_workload(&w);
        check_replicas_fit_the_store(&w);
    }
}

#[test]
fn the_rules_configmap_is_the_example_rules() {
    let shipped = read(&deploy("kubernetes/base/rules/example.yaml"));
    let example = read(&repo().join("examples/rules.yaml"));
    assert!(
        shipped == example,
        "deploy/kubernetes/base/rules/example.yaml differs from examples/rules.yaml: copy it again"
    );
    // Every file of base/rules/ is in the ConfigMap, and nothing else.
    let kustomization = &yaml_file(&deploy("kubernetes/base/kustomization.yaml"))[0];
    let listed: BTreeSet<String> = list(&kustomization["configMapGenerator"][0]["files"])
        .iter()
        .map(|f| s(f, "file").to_owned())
        .collect();
    let present: BTreeSet<String> = std::fs::read_dir(deploy("kubernetes/base/rules"))
        .unwrap()
        .map(|e| format!("rules/{}", e.unwrap().file_name().to_string_lossy()))
        .collect();
    assert_eq!(
        listed, present,
        "base/rules/ and the configMapGenerator differ"
    );
}

#[test]
fn the_image_tag_is_the_crate_version() {
    let kustomization = &yaml_file(&deploy("kubernetes/base/kustomization.yaml"))[0];
    let image = list(&kustomization["images"])
        .iter()
        .find(|i| i["name"] == "sluice")
        .expect("an images entry for sluice");
    assert_eq!(image["newTag"], env!("CARGO_PKG_VERSION"));
    let build = format!("-t sluice:{} .", env!("CARGO_PKG_VERSION"));
    assert!(
        read(&deploy("Dockerfile")).contains(&build),
        "the Dockerfile's build command does not tag sluice:{}",
        env!("CARGO_PKG_VERSION")
    );
}

#[test]
fn no_manifest_mounts_a_volume_with_subpath() {
    for file in yaml_files(&deploy("kubernetes")) {
        for doc in yaml_file(&file) {
            let pod = &doc["spec"]["template"]["spec"];
            for container in list(&pod["containers"]) {
                for mount in list(&container["volumeMounts"]) {
                    assert!(
                        mount.get("subPath").is_none(),
                        "{}: {mount}: the kubelet never updates a subPath mount, so rules would not reload",
                        file.display()
                    );
                }
            }
        }
    }
}

// ---------------------------------------------------------------------------
// Kubernetes: rendered overlays (need kubectl)
// ---------------------------------------------------------------------------

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
        let Some(redis) = w.settings.redis() else {
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

// ---------------------------------------------------------------------------
// Kubernetes: the binary run with each overlay's pod spec (need kubectl)
// ---------------------------------------------------------------------------

/// A running `sluice` and where it listens.
struct Running {
    process: Process,
    grpc: SocketAddr,
    http: SocketAddr,
}

/// Reads the listen addresses from a human or JSON log line.
fn listening(line: &str) -> Option<(SocketAddr, SocketAddr)> {
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
fn start(args: &[String], env: &BTreeMap<String, String>, label: &str) -> Running {
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
    let mut child = Command::new(env!("CARGO_BIN_EXE_sluice"))
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

fn wait_for_status(addr: SocketAddr, path: &str, want: u16, within: Duration) -> u16 {
    let deadline = Instant::now() + within;
    loop {
        let (status, _) = http(addr, "GET", path, "");
        if status == want || Instant::now() >= deadline {
            return status;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

async fn grpc_health(addr: SocketAddr, service: &str) -> i32 {
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

const SERVING: i32 = tonic_health::pb::health_check_response::ServingStatus::Serving as i32;
const NOT_SERVING: i32 = tonic_health::pb::health_check_response::ServingStatus::NotServing as i32;

/// Runs the binary as the overlay's pod would, against `redis_url` (a local
/// stand-in for the overlay's Redis, when it has one), and checks probes,
/// rules, health and staged shutdown.
async fn run_as_the_pod(overlay: &str, redis_url: Option<String>) {
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
    // A local 3-master cluster with the Secret's (placeholder) password
    // stands in for the external cluster; the overlay's URL keeps its form,
    // only its host list changes.
    let docs = overlay_docs("redis-cluster");
    let w = Workload::new("redis-cluster", &docs);
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
    run_as_the_pod("redis-cluster", Some(url)).await;
}

// ---------------------------------------------------------------------------
// Envoy and Istio
// ---------------------------------------------------------------------------

fn example_rules() -> RuleSet {
    load_paths(&[repo().join("examples/rules.yaml")]).expect("the example rules load")
}

/// The sample request the descriptors are computed for.
const SAMPLE_CLIENT: &str = "192.0.2.7";

fn sample_header(name: &str, path: &str) -> String {
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
fn descriptors(rate_limits: &Value, path: &str) -> Vec<Vec<(String, String)>> {
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
fn assert_limited(domain: &str, descriptors: &[Vec<(String, String)>], label: &str) {
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
fn sample_path(route_match: &Value) -> String {
    if let Some(prefix) = route_match["prefix"].as_str() {
        format!("{}/sample", prefix.trim_end_matches('/'))
    } else if let Some(path) = route_match["path"].as_str() {
        path.to_owned()
    } else {
        panic!("this test knows prefix and path matches only: {route_match}")
    }
}

fn seconds(duration: &Value) -> f64 {
    s(duration, "a duration")
        .strip_suffix('s')
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("not a protobuf duration: {duration}"))
}

/// Checks the rate-limit filter's settings; returns its domain and the
/// cluster it calls.
fn check_ratelimit_filter(filter: &Value, label: &str) -> (String, String) {
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
    let redis_ms = Settings::default().redis_timeout_ms as f64;
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

fn envoy_config() -> Value {
    yaml_file(&deploy("envoy/envoy.yaml")).remove(0)
}

/// The HTTP connection managers of every listener.
fn connection_managers(config: &Value) -> Vec<&Value> {
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

fn istio_filter() -> Value {
    let docs = yaml_file(&deploy("envoy/istio-envoyfilter.yaml"));
    assert_eq!(docs.len(), 1);
    docs.into_iter().next().unwrap()
}

fn patches<'a>(filter: &'a Value, apply_to: &'a str) -> impl Iterator<Item = &'a Value> + 'a {
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

fn envoy_validates(envoy: &Path, config: &Path) {
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
fn get(addr: SocketAddr, path: &str) -> (u16, String) {
    let (status, head, _) = support::http_exchange(addr, "GET", path, "");
    (status, head)
}

/// An application that answers every request with 200.
fn application() -> SocketAddr {
    use std::io::{Read, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { continue };
            let mut request = Vec::new();
            let mut buf = [0; 1024];
            while !request.windows(4).any(|w| w == b"\r\n\r\n") {
                match stream.read(&mut buf) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => request.extend_from_slice(&buf[..n]),
                }
            }
            let _ = stream
                .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\nconnection: close\r\n\r\nok");
        }
    });
    addr
}

#[test]
fn envoy_limits_requests_through_sluice_end_to_end() {
    let envoy = envoy_binary();
    // Sluice with the example rules, as `sluice serve` runs by default.
    let (sluice, grpc) = support::start_binary(&[]);
    let grpc: SocketAddr = grpc.parse().unwrap();
    let app = application();

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
    for cluster in config["static_resources"]["clusters"]
        .as_array_mut()
        .unwrap()
    {
        let to = if cluster["name"] == "sluice" {
            grpc
        } else {
            app
        };
        for endpoints in cluster["load_assignment"]["endpoints"]
            .as_array_mut()
            .unwrap()
        {
            for lb in endpoints["lb_endpoints"].as_array_mut().unwrap() {
                lb["endpoint"]["address"]["socket_address"] =
                    json!({"address": "127.0.0.1", "port_value": to.port()});
            }
        }
    }
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

// ---------------------------------------------------------------------------
// Dockerfile
// ---------------------------------------------------------------------------

/// What the tests read from deploy/Dockerfile's final stage.
struct Dockerfile {
    user: String,
    expose: Vec<u16>,
    entrypoint: Vec<String>,
    cmd: Vec<String>,
    /// `(source, destination)` of every COPY from the build context.
    context_copies: Vec<(String, String)>,
    /// Destinations of COPY --from=… in the final stage.
    final_copies_from_stages: Vec<(String, String)>,
    stages: usize,
    run: Vec<String>,
}

fn dockerfile() -> Dockerfile {
    let text = read(&deploy("Dockerfile"));
    let mut instructions: Vec<String> = Vec::new();
    let mut current = String::new();
    for line in text.lines() {
        let line = line.trim();
        if line.starts_with('#') || (line.is_empty() && current.is_empty()) {
            continue;
        }
        match line.strip_suffix('\\') {
            Some(part) => current.push_str(part),
            None => {
                current.push_str(line);
                if !current.trim().is_empty() {
                    instructions.push(std::mem::take(&mut current));
                }
            }
        }
    }
    let mut file = Dockerfile {
        user: String::new(),
        expose: Vec::new(),
        entrypoint: Vec::new(),
        cmd: Vec::new(),
        context_copies: Vec::new(),
        final_copies_from_stages: Vec::new(),
        stages: 0,
        run: Vec::new(),
    };
    let json_form = |rest: &str| -> Vec<String> {
        serde_json::from_str(rest)
            .unwrap_or_else(|e| panic!("use the JSON form (exec form) for {rest}: {e}"))
    };
    for instruction in instructions {
        let (op, rest) = instruction
            .trim()
            .split_once(char::is_whitespace)
            .unwrap_or((instruction.as_str(), ""));
        let rest = rest.trim();
        match op.to_ascii_uppercase().as_str() {
            "FROM" => {
                file.stages += 1;
                file.final_copies_from_stages.clear();
                file.user.clear();
                file.expose.clear();
            }
            "USER" => file.user = rest.to_owned(),
            "EXPOSE" => file.expose.extend(
                rest.split_whitespace()
                    .map(|p| p.trim_end_matches("/tcp").parse::<u16>().expect("a port")),
            ),
            "ENTRYPOINT" => file.entrypoint = json_form(rest),
            "CMD" => file.cmd = json_form(rest),
            "RUN" => file.run.push(rest.to_owned()),
            "COPY" => {
                let words: Vec<&str> = rest.split_whitespace().collect();
                let from_stage = words.iter().any(|w| w.starts_with("--from="));
                let operands: Vec<&str> = words
                    .iter()
                    .copied()
                    .filter(|w| !w.starts_with("--"))
                    .collect();
                let (dest, sources) = operands.split_last().expect("COPY operands");
                for source in sources {
                    let pair = ((*source).to_owned(), (*dest).to_owned());
                    if from_stage {
                        file.final_copies_from_stages.push(pair);
                    } else {
                        file.context_copies.push(pair);
                    }
                }
            }
            _ => {}
        }
    }
    file
}

fn dockerignore() -> Vec<String> {
    read(&repo().join(".dockerignore"))
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(|l| l.trim_matches('/').to_owned())
        .collect()
}

#[test]
fn the_dockerfile_runs_sluice_serve_as_a_non_root_user_on_its_ports() {
    let file = dockerfile();
    assert!(file.stages >= 2, "a multi-stage build");
    let uid: u32 = file
        .user
        .split(':')
        .next()
        .unwrap()
        .parse()
        .unwrap_or_else(|_| {
            panic!(
                "USER {} must be numeric, so runAsNonRoot can check it",
                file.user
            )
        });
    assert_ne!(uid, 0, "USER must not be root");

    let defaults = Settings::default();
    let mut exposed = file.expose.clone();
    exposed.sort_unstable();
    let mut ports = vec![defaults.grpc_addr.port(), defaults.http_addr.port()];
    ports.sort_unstable();
    assert_eq!(
        exposed, ports,
        "EXPOSE must be Sluice's gRPC and HTTP ports"
    );

    assert_eq!(file.entrypoint, [ENTRYPOINT]);
    assert!(
        file.final_copies_from_stages
            .iter()
            .any(|(_, dest)| dest == ENTRYPOINT),
        "the binary is not copied to {ENTRYPOINT}"
    );
    // The default command goes through Sluice's parsers, and its rules path
    // is where the image puts the example rules.
    let settings = settings_of(&file.cmd, &BTreeMap::new(), "Dockerfile CMD");
    let rules = settings.rules.expect("CMD names a rules path");
    assert!(
        file.context_copies
            .iter()
            .any(|(_, dest)| Path::new(dest).parent() == Some(rules.as_path())),
        "nothing is copied into the rules directory {}",
        rules.display()
    );
    assert!(
        file.run
            .iter()
            .any(|r| r.contains("cargo build --release --locked --bin sluice")),
        "the build stage builds the sluice binary from Cargo.lock"
    );
}

#[test]
fn the_dockerfile_copies_only_what_exists_and_is_not_ignored() {
    let file = dockerfile();
    let ignored = dockerignore();
    assert!(
        ignored.iter().any(|i| i == "target"),
        ".dockerignore must leave target/ out of the build context"
    );
    let is_ignored = |path: &str| {
        let first = path.split('/').next().unwrap();
        ignored.iter().any(|i| i == first || i == path)
    };
    assert!(!file.context_copies.is_empty());
    for (source, _) in &file.context_copies {
        if source == "." {
            // The whole context: what the build needs must be in it.
            for needed in [
                "Cargo.toml",
                "Cargo.lock",
                "build.rs",
                "proto",
                "src",
                "examples/rules.yaml",
            ] {
                assert!(repo().join(needed).exists(), "{needed} is missing");
                assert!(!is_ignored(needed), ".dockerignore leaves out {needed}");
            }
        } else {
            assert!(repo().join(source).exists(), "COPY {source}: no such path");
            assert!(
                !is_ignored(source),
                "COPY {source}: left out by .dockerignore"
            );
        }
    }
}

// ---------------------------------------------------------------------------
// Documentation
// ---------------------------------------------------------------------------

fn readme() -> String {
    read(&repo().join("README.md"))
}

#[test]
fn the_readme_documents_every_setting_with_its_env_and_flag() {
    let readme = readme();
    for key in setting_names() {
        let row = format!(
            "`{key}` / `SLUICE_{}` / `--{}`",
            key.to_uppercase(),
            key.replace('_', "-")
        );
        assert!(readme.contains(&row), "README.md does not document {row}");
    }
}

/// The metric names registered in src/telemetry/metrics.rs, where every
/// metric is defined (families without samples yet do not show in
/// `/metrics`, so the source is the complete list).
fn registered_metrics() -> Vec<String> {
    let source = read(&repo().join("src/telemetry/metrics.rs"));
    source
        .split("registry.register(")
        .skip(1)
        .map(|call| {
            let name = call.split('"').nth(1).expect("a metric name");
            name.to_owned()
        })
        .collect()
}

#[test]
fn the_readme_lists_every_metric_and_no_other() {
    let readme = readme();
    let registered = registered_metrics();
    assert!(registered.len() >= 10, "found only {registered:?}");
    // prometheus-client exposes counters with a `_total` suffix.
    let exposed = |name: &str| [format!("{name}_total"), name.to_owned()];
    for name in &registered {
        assert!(
            exposed(name)
                .iter()
                .any(|n| readme.contains(&format!("| `{n}` |"))),
            "README.md's metrics table lacks {name}"
        );
    }
    for line in readme.lines().filter(|l| l.starts_with("| `sluice_")) {
        let cell = line.split('`').nth(1).unwrap();
        assert!(
            registered
                .iter()
                .any(|name| exposed(name).iter().any(|n| n == cell)),
            "README.md lists {cell}, which src/telemetry/metrics.rs does not define"
        );
    }
}

#[test]
fn the_readme_and_deploy_readme_name_every_overlay() {
    let readme = readme();
    let deploy_readme = read(&deploy("README.md"));
    for overlay in overlay_names() {
        let cell = format!("| `{overlay}` |");
        assert!(readme.contains(&cell), "README.md: no row for {overlay}");
        assert!(
            deploy_readme.contains(&cell),
            "deploy/README.md: no row for {overlay}"
        );
    }
}

#[test]
fn the_readme_quick_start_is_two_commands() {
    let readme = readme();
    let start = readme
        .find("## Quick start")
        .expect("a Quick start section");
    let section = &readme[start..];
    let section = &section[..section[3..].find("\n## ").map_or(section.len(), |e| e + 3)];
    let commands: Vec<&str> = section
        .split("```sh\n")
        .skip(1)
        .map(|block| block.split("```").next().unwrap().trim())
        .collect();
    assert_eq!(commands, ["cargo run --release -- serve", "tests/run"]);
}
