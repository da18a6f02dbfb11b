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
//! against the binary, and for the paths it copies. The README and the
//! manual (docs/src/) are checked for the facts an operator copies from
//! them: every setting, every metric, every overlay, a two-command quick
//! start; and every code block of theirs is run by a test or marked
//! (`docs`).
//!
//! One module per concept: `render` (kustomize, or the overlays assembled
//! from their files), `workload` (the container as Sluice reads it, and the
//! named checks), `manifests` (tests on the files), `overlays` (rendered
//! overlays), `pod` (the binary run with each pod spec: probes, health,
//! shutdown), `envoy` (Envoy and Istio), `dockerfile`, `readme` and `docs`. This
//! file holds what they share: file and YAML helpers and constants.

#[path = "../support/mod.rs"]
mod support;

mod dockerfile;
mod docs;
mod envoy;
mod envoy_gateway;
mod image;
mod layering;
mod manifests;
mod observability;
mod overlays;
mod pod;
mod readme;
mod render;
mod sizes;
mod workload;

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

// The helpers the test modules share, in scope for each through
// `use super::*`.
use {dockerfile::*, pod::*, render::*, workload::*};

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
