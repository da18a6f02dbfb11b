//! The container image as `deploy/image/build.sh` writes it: the amd64
//! archive (`SLUICE_TEST_IMAGE`, which `tests/run` builds, or built here
//! with build.sh) unpacked with umoci, its config and files checked, and
//! its entrypoint run from the unpacked root filesystem under `chroot`, as
//! the image's user, with the environment of each Kubernetes overlay and of
//! Envoy Gateway's rate-limit Deployment. The mounts a kubelet makes (the
//! rules ConfigMap, EG's certificates and statsd mapping, `/etc/hosts`) are
//! laid out in the root filesystem; Redis, a Redis Cluster and EG's xDS
//! server are local stand-ins on loopback, which the chrooted process
//! reaches since it shares the network. The arm64 image
//! (`SLUICE_TEST_ARM64_IMAGE`, or built here) is unpacked and its binary
//! run under `qemu-aarch64-static`.
//!
//! chroot needs root: as another user the config and files are still
//! checked (umoci unpacks rootless), and the tests that run the image say
//! that they were skipped.

use super::*;

/// Envoy Gateway's Deployment run with the image.
mod envoy_gateway;

/// The paths build.sh puts in the image, and nothing else: no shell.
const IMAGE_FILES: &[&str] = &[
    "bin",
    "bin/ratelimit",
    "etc",
    "etc/group",
    "etc/passwd",
    "etc/sluice",
    "etc/sluice/rules",
    "etc/sluice/rules/example.yaml",
    "etc/ssl",
    "etc/ssl/certs",
    "etc/ssl/certs/ca-certificates.crt",
    "sluice",
];

fn is_root() -> bool {
    use std::os::unix::fs::MetadataExt as _;
    std::fs::metadata("/proc/self").unwrap().uid() == 0
}

/// `program`'s path on PATH, or a panic saying what to install.
fn tool(program: &str, package: &str) -> PathBuf {
    std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default())
        .map(|dir| dir.join(program))
        .find(|path| path.is_file())
        .unwrap_or_else(|| {
            panic!(
                "{program} not found: install {package} (tests/run does: apt-get install {package})"
            )
        })
}

fn run(command: &mut Command, what: &str) -> String {
    let out = command.output().unwrap_or_else(|e| panic!("{what}: {e}"));
    assert!(
        out.status.success(),
        "{what}: {}\n{}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The image of `arch` as an OCI layout: the archive named by `env`, or
/// one built now by build.sh (cargo reuses what it built before), untarred
/// once per test process.
fn layout(arch: &str, env: &str) -> &'static Path {
    static LAYOUTS: [OnceLock<PathBuf>; 2] = [OnceLock::new(), OnceLock::new()];
    let slot = usize::from(arch == "arm64");
    LAYOUTS[slot].get_or_init(|| {
        let dir = repo().join("target/image");
        std::fs::create_dir_all(&dir).unwrap();
        let archive = match std::env::var_os(env) {
            Some(path) => PathBuf::from(path),
            None => {
                eprintln!("{env} not set: building the {arch} image with deploy/image/build.sh");
                tool("umoci", "umoci");
                tool("skopeo", "skopeo");
                let out = dir.join(format!("test-sluice-{arch}.tar"));
                let mut build = Command::new(deploy("image/build.sh"));
                // Without the variables cargo sets for this test, so that
                // cargo sees the build a shell (tests/run) makes.
                for (name, _) in std::env::vars_os() {
                    let name = name.to_string_lossy();
                    if name == "CARGO"
                        || (name.starts_with("CARGO_")
                            && !matches!(&*name, "CARGO_HOME" | "CARGO_TARGET_DIR"))
                    {
                        build.env_remove(&*name);
                    }
                }
                run(build.arg(arch).arg(&out), "deploy/image/build.sh");
                out
            }
        };
        // One layout per test process; those of processes gone are removed.
        let prefix = format!("test-layout-{arch}-");
        for entry in std::fs::read_dir(&dir).unwrap() {
            let name = entry.unwrap().file_name().to_string_lossy().into_owned();
            if let Some(pid) = name.strip_prefix(&prefix)
                && !Path::new("/proc").join(pid).exists()
            {
                let _ = std::fs::remove_dir_all(dir.join(&name));
            }
        }
        let layout = dir.join(format!("{prefix}{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&layout);
        std::fs::create_dir_all(&layout).unwrap();
        run(
            Command::new("tar")
                .arg("-xf")
                .arg(&archive)
                .arg("-C")
                .arg(&layout),
            "untar the image archive",
        );
        layout
    })
}

/// The image's manifest and config.
struct Image {
    manifest: Value,
    config: Value,
}

fn blob(layout: &Path, digest: &Value) -> Value {
    let digest = s(digest, "digest");
    let hex = digest.strip_prefix("sha256:").expect("a sha256 digest");
    serde_json::from_str(&read(&layout.join("blobs/sha256").join(hex))).unwrap()
}

fn image(layout: &Path) -> Image {
    let index: Value = serde_json::from_str(&read(&layout.join("index.json"))).unwrap();
    let manifests = list(&index["manifests"]);
    assert_eq!(manifests.len(), 1, "one image in the archive: {index}");
    assert_eq!(
        manifests[0]["annotations"]["org.opencontainers.image.ref.name"],
        env!("CARGO_PKG_VERSION"),
        "the archive's tag is the version"
    );
    let manifest = blob(layout, &manifests[0]["digest"]);
    let config = blob(layout, &manifest["config"]["digest"]);
    Image { manifest, config }
}

/// The image unpacked by umoci into a directory of its own (each test gets
/// a root filesystem it may mount things into); rootless as another user.
fn unpack(layout: &Path) -> tempfile::TempDir {
    static UNPACKING: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let bundle = tempfile::tempdir().unwrap();
    let target = bundle.path().join("bundle");
    let mut umoci = Command::new(tool("umoci", "umoci"));
    umoci.arg("unpack");
    if !is_root() {
        umoci.arg("--rootless");
    }
    umoci
        .arg("--image")
        .arg(format!(
            "{}:{}",
            layout.display(),
            env!("CARGO_PKG_VERSION")
        ))
        .arg(&target);
    let _one_at_a_time = UNPACKING.lock().unwrap_or_else(|e| e.into_inner());
    run(&mut umoci, "umoci unpack");
    bundle
}

fn rootfs(bundle: &tempfile::TempDir) -> PathBuf {
    bundle.path().join("bundle/rootfs")
}

/// Whether an ELF file asks for a program interpreter (a dynamic loader),
/// and its machine number.
fn elf_interp_and_machine(path: &Path) -> (bool, u16) {
    let bytes = std::fs::read(path).unwrap();
    assert_eq!(&bytes[..4], b"\x7fELF", "{} is not ELF", path.display());
    assert_eq!(bytes[4], 2, "64-bit ELF");
    let u16_at = |at: usize| u16::from_le_bytes([bytes[at], bytes[at + 1]]);
    let u64_at = |at: usize| u64::from_le_bytes(bytes[at..at + 8].try_into().unwrap());
    let (phoff, phentsize, phnum) = (u64_at(0x20) as usize, u16_at(0x36), u16_at(0x38));
    let interp = (0..usize::from(phnum)).any(|i| {
        let at = phoff + i * usize::from(phentsize);
        u32::from_le_bytes(bytes[at..at + 4].try_into().unwrap()) == 3 // PT_INTERP
    });
    (interp, u16_at(0x12))
}

#[test]
fn the_image_config_is_what_the_manifests_expect() {
    let image = image(layout("amd64", "SLUICE_TEST_IMAGE"));
    let (config, docker) = (&image.config["config"], dockerfile());
    assert_eq!(image.config["architecture"], "amd64");
    assert_eq!(image.config["os"], "linux");
    assert_eq!(
        config["User"],
        docker.user.as_str(),
        "the Dockerfile's USER"
    );
    assert_eq!(config["Entrypoint"], json!([ENTRYPOINT]));
    assert_eq!(config["Cmd"], json!(docker.cmd), "the Dockerfile's CMD");
    let defaults = Settings::default();
    let mut ports: Vec<String> = config["ExposedPorts"]
        .as_object()
        .expect("exposed ports")
        .keys()
        .cloned()
        .collect();
    ports.sort();
    let mut want = vec![
        format!("{}/tcp", defaults.grpc_addr.port()),
        format!("{}/tcp", defaults.http_addr.port()),
    ];
    want.sort();
    assert_eq!(ports, want);
    assert!(list(&config["Env"]).is_empty(), "no environment: {config}");
    assert_eq!(list(&image.manifest["layers"]).len(), 1, "one layer");

    let annotations = &image.manifest["annotations"];
    let annotation = |key: &str| s(&annotations[format!("org.opencontainers.image.{key}")], key);
    assert_eq!(annotation("version"), env!("CARGO_PKG_VERSION"));
    assert_eq!(annotation("licenses"), "Apache-2.0");
    assert_eq!(annotation("title"), "sluice");
    let source = std::env::var("SLUICE_IMAGE_SOURCE");
    let source = source.as_deref().unwrap_or(env!("CARGO_PKG_REPOSITORY"));
    assert_eq!(
        annotation("source"),
        source,
        "the source is Cargo.toml's repository"
    );
    let revision = annotation("revision");
    assert!(
        revision.len() == 40 && revision.chars().all(|c| c.is_ascii_hexdigit()),
        "revision is a commit: {revision}"
    );
    if std::env::var_os("SLUICE_TEST_IMAGE").is_none() {
        let head = run(
            Command::new("git")
                .args(["rev-parse", "HEAD"])
                .current_dir(repo()),
            "git rev-parse HEAD",
        );
        assert_eq!(revision, head.trim(), "built here, from HEAD");
    }
    // The same pairs as labels, for tools that read only the config.
    for (key, value) in annotations.as_object().unwrap() {
        assert_eq!(&config["Labels"][key], value, "label {key}");
    }
    // Under the manifests' pod security settings: the user the manifests
    // run as is the image's.
    let docs = overlay_docs("memory");
    let w = Workload::new("memory", &docs);
    let context = &w.pod["securityContext"];
    assert_eq!(
        config["User"],
        format!("{}:{}", context["runAsUser"], context["runAsGroup"])
    );
}

#[test]
fn the_image_holds_a_static_binary_the_rules_and_ca_certificates_and_no_shell() {
    use std::os::unix::fs::{MetadataExt as _, PermissionsExt as _};
    let bundle = unpack(layout("amd64", "SLUICE_TEST_IMAGE"));
    let root = rootfs(&bundle);
    let mut files = Vec::new();
    let mut stack = vec![root.clone()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            files.push(path.strip_prefix(&root).unwrap().display().to_string());
            if path.is_dir() && !path.is_symlink() {
                stack.push(path);
            }
        }
    }
    files.sort();
    assert_eq!(files, IMAGE_FILES, "the image's files");

    let binary = root.join(ENTRYPOINT.trim_start_matches('/'));
    let meta = std::fs::metadata(&binary).unwrap();
    assert_eq!(meta.permissions().mode() & 0o777, 0o755);
    if is_root() {
        assert_eq!((meta.uid(), meta.gid()), (0, 0), "owned by root");
    }
    assert_eq!(
        elf_interp_and_machine(&binary),
        (false, 62),
        "static x86-64"
    );
    assert_eq!(
        std::fs::read_link(root.join("bin/ratelimit")).unwrap(),
        Path::new(ENTRYPOINT)
    );
    assert_eq!(
        read(&root.join("etc/sluice/rules/example.yaml")),
        read(&repo().join("examples/rules.yaml"))
    );
    let bundle_pem = read(&root.join(CA_CERTIFICATES.trim_start_matches('/')));
    let certs = rustls_pki_types::CertificateDer::pem_slice_iter(bundle_pem.as_bytes())
        .collect::<Result<Vec<_>, _>>()
        .expect("the CA bundle parses");
    assert!(certs.len() > 10, "{} CA certificates", certs.len());
    assert!(
        read(&root.join("etc/passwd")).contains(":65532:65532:"),
        "/etc/passwd names the image's user"
    );
}

use rustls_pki_types::pem::PemObject as _;

/// The entrypoint (or `command`) of the unpacked image run under chroot as
/// `user`, with `args` and exactly `env`.
fn chroot(root: &Path, user: &str, command: &[String]) -> Command {
    let mut chroot = Command::new(tool("chroot", "coreutils"));
    chroot
        .arg(format!("--userspec={user}"))
        .arg(root)
        .args(command);
    chroot
}

/// `sluice query` from the image, under chroot, until the descriptor is
/// refused: the first answer's `remaining N`, then N more admitted, then
/// OVER_LIMIT (exit status 1).
fn limit_is_enforced(root: &Path, user: &str, query: &[String], label: &str) {
    let ask = || {
        let mut command = chroot(root, user, &[ENTRYPOINT.to_owned()]);
        let out = command.args(query).env_clear().output().unwrap();
        let text = String::from_utf8_lossy(&out.stdout).into_owned()
            + &String::from_utf8_lossy(&out.stderr);
        (out.status.code(), text)
    };
    let (code, first) = ask();
    assert_eq!(code, Some(0), "{label}: the first query: {first}");
    let remaining: u64 = first
        .split("remaining ")
        .nth(1)
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("{label}: no `remaining N` in {first}"));
    for _ in 0..remaining {
        let (code, text) = ask();
        assert_eq!(code, Some(0), "{label}: admitted within the limit: {text}");
    }
    let (code, text) = ask();
    assert_eq!(code, Some(1), "{label}: over the limit: {text}");
    assert!(text.contains("OVER_LIMIT"), "{label}: {text}");
}

/// The image run as `overlay`'s pod: its args after the image's
/// entrypoint, its environment, the rules ConfigMap mounted over the
/// image's rules directory, as the pod's user.
fn run_image_as_the_pod(overlay: &str, redis_url: Option<String>) {
    if !is_root() {
        eprintln!("skipped: running the image under chroot needs root");
        return;
    }
    let bundle = unpack(layout("amd64", "SLUICE_TEST_IMAGE"));
    let root = rootfs(&bundle);
    let docs = overlay_docs(overlay);
    let w = Workload::new(overlay, &docs);
    let (mount, configmap) = w.rules_mount();
    let mount = root.join(s(&mount["mountPath"], "mountPath").trim_start_matches('/'));
    std::fs::remove_dir_all(&mount).unwrap();
    std::fs::create_dir_all(&mount).unwrap();
    lay_out_configmap(find(&docs, "ConfigMap", configmap).unwrap(), &mount);
    let mut env = w.env.clone();
    match (&w.settings.redis_url, redis_url) {
        (Some(_), Some(url)) => {
            env.insert("SLUICE_REDIS_URL".into(), url);
        }
        (None, None) => {}
        (set, given) => panic!("{overlay}: Redis in the overlay: {set:?}, given: {given:?}"),
    }
    let context = &w.pod["securityContext"];
    let user = format!("{}:{}", context["runAsUser"], context["runAsGroup"]);
    let image = image(layout("amd64", "SLUICE_TEST_IMAGE"));
    let entrypoint: Vec<String> =
        serde_json::from_value(image.config["config"]["Entrypoint"].clone()).unwrap();
    let running = start_command(chroot(&root, &user, &entrypoint), &w.args, &env, overlay);

    for probe in ["startupProbe", "livenessProbe", "readinessProbe"] {
        let path = s(&w.container[probe]["httpGet"]["path"], "probe path");
        assert_eq!(
            wait_for_status(running.http, path, 200, Duration::from_secs(10)),
            200,
            "{overlay}: {probe} {path}"
        );
    }
    assert_eq!(http(running.http, "GET", "/healthcheck", "").0, 200);
    let query = [
        "query".to_owned(),
        format!("--addr={}", running.grpc),
        "--domain=example".to_owned(),
        "--descriptor=remote_address=192.0.2.99".to_owned(),
    ];
    limit_is_enforced(&root, &user, &query, overlay);
}

#[test]
fn the_image_runs_with_the_memory_overlays_pod_spec() {
    run_image_as_the_pod("memory", None);
}

#[test]
fn the_image_runs_with_the_redis_overlays_pod_spec() {
    let redis = RedisServer::start();
    run_image_as_the_pod("redis", Some(redis.url()));
}

#[test]
fn the_image_runs_with_the_redis_cluster_overlays_pod_spec() {
    let docs = overlay_docs("redis-cluster");
    let w = Workload::new("redis-cluster", &docs);
    let (_cluster, url) = redis_cluster_stand_in(&w);
    run_image_as_the_pod("redis-cluster", Some(url));
}

#[test]
fn the_arm64_image_runs_its_binary_under_qemu() {
    let layout = layout("arm64", "SLUICE_TEST_ARM64_IMAGE");
    let image = image(layout);
    assert_eq!(image.config["architecture"], "arm64");
    assert_eq!(image.config["config"]["Entrypoint"], json!([ENTRYPOINT]));
    let bundle = unpack(layout);
    let root = rootfs(&bundle);
    let binary = root.join(ENTRYPOINT.trim_start_matches('/'));
    assert_eq!(
        elf_interp_and_machine(&binary),
        (false, 183),
        "static aarch64"
    );
    let qemu = tool("qemu-aarch64-static", "qemu-user-static");
    let version = run(
        Command::new(&qemu).arg(&binary).arg("--version"),
        "sluice --version under qemu",
    );
    assert_eq!(
        version.trim(),
        format!("sluice {}", env!("CARGO_PKG_VERSION"))
    );
    let checked = run(
        Command::new(&qemu)
            .arg(&binary)
            .arg("check-config")
            .arg(root.join("etc/sluice/rules")),
        "sluice check-config under qemu",
    );
    assert!(checked.contains("ok: domain 'example'"), "{checked}");
}
