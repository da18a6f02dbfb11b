//! Compiles the trimmed Envoy RLS, RLQS and ADS protos and upstream ratelimit's
//! xDS rule format (`RateLimitConfig`) in `proto/` with `protox` (a pure-Rust
//! protobuf compiler, so no system `protoc` is needed) and generates the tonic
//! servers and clients. The ADS server is generated too: the xDS tests run a
//! management server in Rust. The encoded descriptor set is written next to the
//! code for gRPC server reflection.
//!
//! It also sets `SLUICE_REVISION` (the commit built, from git; "unknown"
//! outside a git checkout; `SLUICE_REVISION` in the build's environment
//! wins) and `SLUICE_RUSTC` (the compiler's version) for the
//! `sluice_build_info` metric.
//!
//! It also assembles the Redis store's decision script, `decide.lua` in
//! `OUT_DIR`, from its parts in `src/store/redis/decide/` (one file per
//! algorithm and the driver; `prelude.lua` says why and in what order), and
//! `refund.lua` from `src/store/redis/refund.lua` and the same parts; the
//! records the scripts name are numbered by `build/lua.rs`; and its batch
//! script, `batch.lua`, from the same prelude and algorithms around
//! `decide/batch.lua`.

#[path = "build/lua.rs"]
mod lua;

use std::{env, fs, path::PathBuf};

/// The services Sluice serves: the only ones gRPC reflection lists.
const PROTOS: &[&str] = &[
    "envoy/service/ratelimit/v3/rls.proto",
    "envoy/service/rate_limit_quota/v3/rlqs.proto",
];

/// What the xDS client speaks. Sluice is an ADS client, never a server, so these
/// stay out of the reflection descriptor set.
const XDS_PROTOS: &[&str] = &[
    "envoy/service/discovery/v3/ads.proto",
    "ratelimit/config/ratelimit/v3/rls_conf.proto",
];

/// The parts of decide.lua, in the order they are joined: the contract and
/// shared arithmetic first, each algorithm before the driver that calls it.
const DECIDE_PARTS: &[&str] = &[
    "prelude",
    "clock",
    "request",
    "sliding_window",
    "fixed_window",
    "token_bucket",
    "sliding_log",
    "calendar_window",
    "driver",
];

/// Joins the parts into one chunk (Redis runs one script per call); a
/// comment line marks where each part starts, for error line numbers.
fn assemble_decide(out_dir: &std::path::Path) -> std::io::Result<()> {
    println!("cargo:rerun-if-changed=src/store/redis/decide");
    let mut script = String::new();
    for part in DECIDE_PARTS {
        let path = format!("src/store/redis/decide/{part}.lua");
        script.push_str(&format!("-- {path}\n"));
        script.push_str(&fs::read_to_string(&path)?);
        script.push('\n');
    }
    write_lua(out_dir, "decide.lua", &script)
}

/// The algorithms' parts of decide.lua, which refund.lua shares.
const ALGORITHM_PARTS: &[&str] = &[
    "sliding_window",
    "fixed_window",
    "token_bucket",
    "sliding_log",
    "calendar_window",
];

/// refund.lua: `src/store/redis/refund.lua` with its marker lines replaced by
/// decide.lua's prelude and by its algorithms' parts (their 'undo').
fn assemble_refund(out_dir: &std::path::Path) -> std::io::Result<()> {
    println!("cargo:rerun-if-changed=src/store/redis/refund.lua");
    let part = |name: &str| -> std::io::Result<String> {
        let path = format!("src/store/redis/decide/{name}.lua");
        Ok(format!("-- {path}\n{}\n", fs::read_to_string(&path)?))
    };
    let mut algorithms = String::new();
    for name in ALGORITHM_PARTS {
        assert!(
            DECIDE_PARTS.contains(name),
            "{name} is not a part of decide.lua"
        );
        algorithms.push_str(&part(name)?);
    }
    let source = fs::read_to_string("src/store/redis/refund.lua")?;
    let mut script = String::from("-- src/store/redis/refund.lua\n");
    for line in source.split_inclusive('\n') {
        match line.trim_end() {
            "-- @@ prelude @@" => script.push_str(&part("prelude")?),
            "-- @@ algorithms @@" => script.push_str(&algorithms),
            _ => script.push_str(line),
        }
    }
    write_lua(out_dir, "refund.lua", &script)
}

/// Writes a script with its records' names numbered (build/lua.rs), or
/// fails the build saying which name is wrong.
fn write_lua(out_dir: &std::path::Path, name: &str, script: &str) -> std::io::Result<()> {
    let expanded =
        lua::expand(script).map_err(|e| std::io::Error::other(format!("{name}: {e}")))?;
    fs::write(out_dir.join(name), expanded)
}

/// The algorithms a batch call decides (see `decide/batch.lua`).
const BATCH_ALGORITHMS: &[&str] = &["sliding_window", "fixed_window", "token_bucket"];

/// Assembles `batch.lua`: the prelude, then `decide/batch.lua` with the
/// algorithms it decides in place of its marker line.
fn assemble_batch(out_dir: &std::path::Path) -> std::io::Result<()> {
    let part = |name: &str| {
        let path = format!("src/store/redis/decide/{name}.lua");
        Ok::<_, std::io::Error>(format!("-- {path}\n{}\n", fs::read_to_string(&path)?))
    };
    let mut algorithms = String::new();
    for name in BATCH_ALGORITHMS {
        algorithms.push_str(&part(name)?);
    }
    let batch = part("batch")?;
    let marker = "-- @@ algorithms @@\n";
    if !batch.contains(marker) {
        return Err(std::io::Error::other(
            "decide/batch.lua has no algorithms marker",
        ));
    }
    let script = part("prelude")? + &part("clock")? + &batch.replacen(marker, &algorithms, 1);
    write_lua(out_dir, "batch.lua", &script)
}

/// Runs `program args` and returns its first line of output, if it ran.
fn first_line(program: &str, args: &[&str]) -> Option<String> {
    let out = std::process::Command::new(program)
        .args(args)
        .output()
        .ok()?;
    let text = String::from_utf8(out.stdout).ok()?;
    let line = text.lines().next()?.trim().to_owned();
    (out.status.success() && !line.is_empty()).then_some(line)
}

/// The revision and compiler for `sluice_build_info`. The build reruns when
/// the checked-out commit moves (HEAD, the branch's ref, packed refs).
fn build_info() {
    println!("cargo:rerun-if-env-changed=SLUICE_REVISION");
    let revision = env::var("SLUICE_REVISION").ok().or_else(|| {
        for git_path in ["HEAD", "packed-refs"] {
            if let Some(path) = first_line("git", &["rev-parse", "--git-path", git_path])
                && std::path::Path::new(&path).exists()
            {
                println!("cargo:rerun-if-changed={path}");
            }
        }
        if let Some(branch) = first_line("git", &["symbolic-ref", "-q", "HEAD"])
            && let Some(path) = first_line("git", &["rev-parse", "--git-path", &branch])
            && std::path::Path::new(&path).exists()
        {
            println!("cargo:rerun-if-changed={path}");
        }
        first_line("git", &["rev-parse", "--short=12", "HEAD"])
    });
    let revision = revision.unwrap_or_else(|| "unknown".to_owned());
    println!("cargo:rustc-env=SLUICE_REVISION={revision}");
    let rustc = env::var("RUSTC").unwrap_or_else(|_| "rustc".to_owned());
    let version = first_line(&rustc, &["--version"]).unwrap_or_else(|| "unknown".to_owned());
    let version = version.split_whitespace().nth(1).unwrap_or("unknown");
    println!("cargo:rustc-env=SLUICE_RUSTC={version}");
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto");
    build_info();
    let out_dir = PathBuf::from(env::var("OUT_DIR")?);
    assemble_decide(&out_dir)?;
    assemble_refund(&out_dir)?;
    assemble_batch(&out_dir)?;

    let mut compiler = protox::Compiler::new(["proto"])?;
    compiler.include_imports(true).include_source_info(false);
    compiler.open_files(PROTOS)?;
    fs::write(
        out_dir.join("sluice_descriptor.bin"),
        compiler.encode_file_descriptor_set(),
    )?;
    compiler.open_files(XDS_PROTOS)?;

    tonic_prost_build::configure()
        .build_server(true)
        .build_client(true)
        .compile_fds(compiler.file_descriptor_set())?;
    Ok(())
}
