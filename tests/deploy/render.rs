//! Rendering: the overlays through `kubectl kustomize`, or assembled from
//! their files when kubectl is missing.

use super::*;

/// `kubectl`, or the program `SLUICE_TEST_KUBECTL` names (a missing one
/// shows what runs without kubectl).
pub(crate) fn kubectl() -> PathBuf {
    std::env::var_os("SLUICE_TEST_KUBECTL").map_or_else(|| PathBuf::from("kubectl"), PathBuf::from)
}

pub(crate) fn kubectl_available() -> bool {
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
pub(crate) fn need_kubectl(test: &str) -> bool {
    if !kubectl_available() {
        eprintln!(
            "{test}: skipped, kubectl is not installed (the checks on the files themselves still ran)"
        );
    }
    kubectl_available()
}

pub(crate) fn kustomize(dir: &Path) -> Vec<Value> {
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

pub(crate) fn overlay_names() -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(deploy("kubernetes/overlays"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

/// `kubectl kustomize` of an overlay.
pub(crate) fn rendered(overlay: &str) -> Vec<Value> {
    kustomize(&deploy(&format!("kubernetes/overlays/{overlay}")))
}

/// A relative path from `from` to `to` (kustomize refuses absolute ones).
pub(crate) fn relative(from: &Path, to: &Path) -> PathBuf {
    let depth = from.components().count() - 1;
    let mut out = PathBuf::new();
    for _ in 0..depth {
        out.push("..");
    }
    out.join(to.strip_prefix("/").expect("an absolute path"))
}

/// The overlay with the monitoring component added, as its README says.
pub(crate) fn rendered_with_monitoring(overlay: &str) -> Vec<Value> {
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
pub(crate) fn base_from_files() -> Vec<Value> {
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
pub(crate) fn overlay_from_files(overlay: &str) -> Vec<Value> {
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
pub(crate) fn overlay_docs(overlay: &str) -> Vec<Value> {
    if kubectl_available() {
        rendered(overlay)
    } else {
        overlay_from_files(overlay)
    }
}

pub(crate) fn merge(target: &mut Value, patch: &Value) {
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
