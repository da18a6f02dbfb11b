//! The Dockerfile: ports, user, entrypoint and command against the binary,
//! and the paths it copies.

use super::*;

/// Where the image keeps the CA certificates (Debian's bundle).
pub(crate) const CA_CERTIFICATES: &str = "/etc/ssl/certs/ca-certificates.crt";

/// What the tests read from deploy/Dockerfile's final stage.
pub(crate) struct Dockerfile {
    pub(crate) user: String,
    pub(crate) expose: Vec<u16>,
    pub(crate) entrypoint: Vec<String>,
    pub(crate) cmd: Vec<String>,
    /// `(source, destination)` of every COPY from the build context.
    pub(crate) context_copies: Vec<(String, String)>,
    /// Destinations of COPY --from=… in the final stage.
    pub(crate) final_copies_from_stages: Vec<(String, String)>,
    pub(crate) stages: usize,
    pub(crate) run: Vec<String>,
    /// Every COPY of the final stage, as written (flags included).
    pub(crate) final_copies: Vec<String>,
    /// The final stage's base image.
    pub(crate) base: String,
    /// `LABEL` pairs of the final stage, quotes removed, `$ARG`s expanded
    /// with the ARG defaults.
    pub(crate) labels: BTreeMap<String, String>,
}

/// Splits `key="a b" other=c` into words, keeping quoted spaces.
fn words(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut word = String::new();
    let mut quoted = false;
    for c in text.chars() {
        match c {
            '"' => quoted = !quoted,
            c if c.is_whitespace() && !quoted => {
                if !word.is_empty() {
                    out.push(std::mem::take(&mut word));
                }
            }
            c => word.push(c),
        }
    }
    if !word.is_empty() {
        out.push(word);
    }
    out
}

pub(crate) fn dockerfile() -> Dockerfile {
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
        final_copies: Vec::new(),
        base: String::new(),
        labels: BTreeMap::new(),
    };
    let mut args: BTreeMap<String, String> = BTreeMap::new();
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
                file.base = rest
                    .split_whitespace()
                    .find(|w| !w.starts_with("--"))
                    .unwrap_or_default()
                    .to_owned();
                file.labels.clear();
                file.final_copies_from_stages.clear();
                file.final_copies.clear();
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
            "ARG" => {
                let (name, default) = rest.split_once('=').unwrap_or((rest, ""));
                args.insert(format!("${name}"), default.to_owned());
            }
            "LABEL" => {
                for pair in words(rest) {
                    let (key, value) = pair.split_once('=').expect("LABEL key=value");
                    let value = args.get(value).cloned().unwrap_or(value.to_owned());
                    file.labels.insert(key.to_owned(), value);
                }
            }
            "COPY" => {
                file.final_copies.push(rest.to_owned());
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

pub(crate) fn dockerignore() -> Vec<String> {
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
    // The binary comes from deploy/image/binary.sh, which build.sh runs
    // too: one build of the service for both ways of making the image.
    assert!(
        file.run
            .iter()
            .any(|r| r.contains("deploy/image/binary.sh \"$TARGETARCH\"")),
        "the build stage builds the binary with deploy/image/binary.sh: {:?}",
        file.run
    );
}

/// deploy/image/binary.sh's `cargo build`: the service alone, static, from
/// the locked dependencies, in a stripped release profile.
#[test]
fn the_image_binary_is_a_locked_static_service_only_dist_build() {
    let script = read(&deploy("image/binary.sh"));
    let build = script
        .lines()
        .find(|l| l.starts_with("cargo build"))
        .expect("deploy/image/binary.sh runs cargo build");
    for flag in ["--locked", "--bin sluice", "--no-default-features"] {
        assert!(build.contains(flag), "cargo build without {flag}: {build}");
    }
    // The profile is `dist` unless SLUICE_PROFILE names another (tests/run's
    // quick `image-check`); releases and the Dockerfile take the default.
    assert!(
        build.contains("--profile \"$profile\""),
        "cargo build takes $profile: {build}"
    );
    let profile = script
        .lines()
        .find_map(|l| l.strip_prefix("profile=\"${SLUICE_PROFILE:-"))
        .and_then(|rest| rest.strip_suffix("}\""))
        .expect("binary.sh sets profile=\"${SLUICE_PROFILE:-NAME}\"");
    assert_eq!(profile, "dist", "releases ship the dist profile");
    assert!(
        script.contains("$triple/$profile/sluice"),
        "the binary is taken from target/TRIPLE/PROFILE/"
    );
    assert!(
        !build.contains("--features") && !build.contains("--all-features"),
        "the image builds the service alone (no `bench`): {build}"
    );
    assert!(script.contains("triple=\"$machine-unknown-linux-musl\""));
    for (arch, machine) in [("amd64", "x86_64"), ("arm64", "aarch64")] {
        assert!(
            script.contains(&format!("{arch}) machine={machine} ;;")),
            "{arch} builds for {machine}"
        );
    }
    let section = cargo_section(&format!("profile.{profile}"));
    assert!(
        section.contains("inherits = \"release\"") && section.contains("strip = true"),
        "[profile.{profile}] must be a stripped release build:{section}"
    );
    let quick = cargo_section("profile.image-check");
    assert!(
        quick.contains("strip = true"),
        "[profile.image-check] is stripped as the shipped binary is:{quick}"
    );
    let run = read(&repo().join("tests/run"));
    assert!(
        run.contains("SLUICE_PROFILE=image-check deploy/image/build.sh"),
        "tests/run checks images built with the quick profile"
    );
}

/// The Dockerfile builds what build.sh builds: an empty base with the CA
/// certificates, and build.sh's annotations as labels.
#[test]
fn the_dockerfile_matches_build_sh() {
    let file = dockerfile();
    assert_eq!(file.base, "scratch", "the static binary needs no base");
    assert!(
        file.final_copies_from_stages
            .iter()
            .any(|(source, dest)| source == CA_CERTIFICATES && dest == CA_CERTIFICATES),
        "the CA certificates are copied to {CA_CERTIFICATES}"
    );
    let script = read(&deploy("image/build.sh"));
    let mut annotations: Vec<&str> = script
        .lines()
        .filter_map(|l| l.trim().strip_prefix("\"org.opencontainers.image."))
        .filter_map(|l| l.split('=').next())
        .filter(|key| *key != "created")
        .collect();
    annotations.sort_unstable();
    let labels: Vec<&str> = file
        .labels
        .keys()
        .filter_map(|k| k.strip_prefix("org.opencontainers.image."))
        .collect();
    assert_eq!(
        labels, annotations,
        "the Dockerfile's labels are build.sh's"
    );
    assert_eq!(
        file.labels["org.opencontainers.image.version"],
        env!("CARGO_PKG_VERSION"),
        "ARG VERSION's default is Cargo.toml's version"
    );
    assert_eq!(
        file.labels["org.opencontainers.image.licenses"],
        "Apache-2.0"
    );
    let cargo = cargo_section("package");
    assert!(cargo.contains("license = \"Apache-2.0\""), "{cargo}");
    assert!(
        cargo.contains(&format!(
            "description = \"{}\"",
            file.labels["org.opencontainers.image.description"]
        )),
        "the description label is Cargo.toml's"
    );
}

/// `bench` is a feature on by default (tests and `sluice bench` need it),
/// and the only thing the image leaves out.
#[test]
fn the_load_generator_is_a_default_feature_the_image_leaves_out() {
    let features = cargo_section("features");
    assert!(
        features.contains("default = [\"bench\"]"),
        "bench must stay a default feature:{features}"
    );
    for dep in ["hdrhistogram", "indicatif", "rand_distr"] {
        assert!(
            features.contains(&format!("\"dep:{dep}\"")),
            "{dep} belongs to the bench feature"
        );
    }
}

/// The lines of Cargo.toml's `[name]` table, up to the next table.
fn cargo_section(name: &str) -> String {
    let cargo = read(&repo().join("Cargo.toml"));
    let header = format!("[{name}]\n");
    let start = cargo
        .find(&header)
        .unwrap_or_else(|| panic!("Cargo.toml has no [{name}]"))
        + header.len();
    let rest = &cargo[start..];
    rest[..rest.find("\n[").unwrap_or(rest.len())].to_owned()
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
                "deploy/image/binary.sh",
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

/// Envoy Gateway runs its rate-limit image as `command: [/bin/ratelimit]`,
/// as user 65534, on a read-only root filesystem.
#[test]
fn the_image_has_bin_ratelimit_pointing_at_sluice_for_any_user() {
    let file = dockerfile();
    let (dir, _) = file
        .final_copies_from_stages
        .iter()
        .find(|(_, dest)| dest.trim_end_matches('/') == "/bin")
        .expect("a COPY --from=build of a directory into /bin/ (for /bin/ratelimit)");
    let link = format!("ln -s {ENTRYPOINT} {}/ratelimit", dir.trim_end_matches('/'));
    assert!(
        file.run.iter().any(|r| r.contains(&link)),
        "the build stage makes {dir}ratelimit a symlink to {ENTRYPOINT} ({link:?})"
    );
    // Not this image's USER but 65534: everything copied must be readable
    // (the binary executable) by others.
    for (copy, mode) in [
        (ENTRYPOINT, "--chmod=0755"),
        ("/etc/sluice/rules/", "--chmod=0644"),
    ] {
        assert!(
            file.final_copies
                .iter()
                .any(|c| c.contains(copy) && c.contains(mode)),
            "the COPY to {copy} sets {mode}: {:?}",
            file.final_copies
        );
    }
}

/// The binary as the image lays it out for Envoy Gateway: called through a
/// symlink named `ratelimit`, as user 65534 when the test runs as root, from
/// a directory nobody may write, with the rules where the image puts them.
#[test]
fn the_binary_serves_through_a_ratelimit_symlink_as_uid_65534_from_a_read_only_directory() {
    use std::os::unix::fs::{MetadataExt as _, PermissionsExt as _};
    use std::os::unix::process::CommandExt as _;
    let root = tempfile::tempdir().unwrap();
    let bin = root.path().join("bin");
    let rules = root.path().join("rules");
    std::fs::create_dir(&bin).unwrap();
    std::fs::create_dir(&rules).unwrap();
    std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_sluice"), bin.join("ratelimit")).unwrap();
    std::fs::copy(
        repo().join("examples/rules.yaml"),
        rules.join("example.yaml"),
    )
    .unwrap();
    for dir in [root.path(), &bin, &rules] {
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o555)).unwrap();
    }
    let mut ratelimit = Command::new(bin.join("ratelimit"));
    ratelimit.current_dir(root.path());
    // /proc/self belongs to the process's effective user.
    if std::fs::metadata("/proc/self").unwrap().uid() == 0 {
        ratelimit.uid(65534).gid(65534);
    } else {
        eprintln!("not root: running as the current user, not 65534");
    }
    let args = [
        "serve".to_owned(),
        "--rules".to_owned(),
        rules.display().to_string(),
    ];
    let running = start_command(ratelimit, &args, &BTreeMap::new(), "/bin/ratelimit");
    assert_eq!(
        wait_for_status(running.http, READINESS_PATH, 200, Duration::from_secs(20)),
        200
    );
    // The example rules were read from the read-only directory.
    let (status, body) = http(running.http, "GET", "/rlconfig", "");
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("example"), "{body}");
    drop(running);
    for dir in [root.path(), &bin, &rules] {
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
}
