//! The fixture: EG's Deployment as the test reads it, and its renders.

use super::*;

// ------------------------------------------------------------ the fixture

pub(crate) fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name)
}

pub(crate) fn text(yaml: &Yaml) -> &str {
    yaml.as_str()
        .unwrap_or_else(|| panic!("expected a string, got {yaml:?}"))
}

/// The parts of the Deployment the test uses.
pub(crate) struct Deployment {
    pub(crate) command: Vec<String>,
    /// `(name, value)` in EG's order.
    pub(crate) env: Vec<(String, String)>,
    /// `(path, port)` of each probe.
    pub(crate) probes: Vec<(String, i64)>,
    /// `(mount path, Secret or ConfigMap name)`.
    pub(crate) mounts: Vec<(String, String)>,
}

impl Deployment {
    /// Checks the facts the test relies on: EG runs `/bin/ratelimit` with
    /// no arguments and probes `/healthcheck` on upstream's HTTP port.
    pub(crate) fn check_entry_point(&self) {
        assert_eq!(self.command, ["/bin/ratelimit"], "EG runs it with no args");
        for (path, port) in &self.probes {
            assert_eq!(
                (path.as_str(), *port),
                ("/healthcheck", 8080),
                "EG's probes"
            );
        }
    }

    /// Mounts each volume in a directory of `root` filled with `contents`
    /// of its Secret or ConfigMap, and rewrites every value of `env` under a
    /// mount path to the same file there.
    pub(crate) fn mount(
        &self,
        env: &mut [(String, String)],
        root: &Path,
        contents: impl Fn(&str) -> Vec<(&'static str, String)>,
    ) {
        for (mount, source) in &self.mounts {
            let local = root.join(source);
            std::fs::create_dir(&local).unwrap();
            for (file, body) in contents(source) {
                std::fs::write(local.join(file), body).unwrap();
            }
            for (_, value) in env.iter_mut() {
                if let Some(rest) = value.strip_prefix(&format!("{mount}/")) {
                    *value = local.join(rest).display().to_string();
                }
            }
        }
    }

    pub(crate) fn load() -> Self {
        let source = std::fs::read_to_string(fixture("eg_ratelimit_deployment.yaml")).unwrap();
        let doc = &YamlLoader::load_from_str(&source).unwrap()[0];
        let pod = &doc["spec"]["template"]["spec"];
        let container = &pod["containers"][0];
        let list = |yaml: &Yaml| yaml.as_vec().cloned().unwrap_or_default();
        let source_of = |volume: &str| {
            let found = list(&pod["volumes"])
                .into_iter()
                .find(|v| text(&v["name"]) == volume)
                .unwrap_or_else(|| panic!("no volume {volume}"));
            let name = &found["secret"]["secretName"];
            text(if name.is_badvalue() {
                &found["configMap"]["name"]
            } else {
                name
            })
            .to_string()
        };
        Self {
            command: list(&container["command"])
                .iter()
                .map(|c| text(c).into())
                .collect(),
            env: list(&container["env"])
                .iter()
                .map(|e| (text(&e["name"]).into(), text(&e["value"]).into()))
                .collect(),
            probes: ["startupProbe", "readinessProbe", "livenessProbe"]
                .iter()
                .map(|p| {
                    let get = &container[*p]["httpGet"];
                    (text(&get["path"]).into(), get["port"].as_i64().unwrap())
                })
                .collect(),
            mounts: list(&container["volumeMounts"])
                .iter()
                .map(|m| (text(&m["mountPath"]).into(), source_of(text(&m["name"]))))
                .collect(),
        }
    }
}

/// Sets `name` in `env`: in place when present, else appended (as EG puts
/// a user's variables after its own).
pub(crate) fn set(env: &mut Vec<(String, String)>, name: &str, value: String) {
    match env.iter_mut().find(|(n, _)| n == name) {
        Some(entry) => entry.1 = value,
        None => env.push((name.into(), value)),
    }
}

/// EG v1.1.1–v1.1.3's render of the same Deployment (contract §2.2): no
/// Prometheus variables, `USE_STATSD=true` followed by `STATSD_PORT=9125`
/// for the statsd-exporter sidecar.
pub(crate) fn eg_v1_1_statsd(mut env: Vec<(String, String)>) -> Vec<(String, String)> {
    env.retain(|(n, _)| !n.starts_with("PROMETHEUS_") && n != "USE_PROMETHEUS");
    let at = env.iter().position(|(n, _)| n == "USE_STATSD").unwrap();
    env[at].1 = "true".into();
    env.insert(at + 1, ("STATSD_PORT".into(), "9125".into()));
    env
}

/// Which render of the Deployment runs.
#[derive(Clone, Copy, PartialEq)]
pub(crate) enum Render {
    /// EG's current default (Prometheus).
    Default,
    /// EG v1.1's, with statsd.
    V1_1Statsd,
    /// EG's current default with a user's `USE_STATSD=true`.
    BothSinks,
}

impl Render {
    /// The container's environment in this render, in order.
    pub(crate) fn env(self, deployment: &Deployment) -> Vec<(String, String)> {
        let env = deployment.env.clone();
        match self {
            Render::Default => env,
            Render::V1_1Statsd => eg_v1_1_statsd(env),
            Render::BothSinks => {
                let mut env = env;
                env.push(("USE_STATSD".into(), "true".into()));
                env
            }
        }
    }
}
