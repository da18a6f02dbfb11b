//! Compiles the trimmed Envoy RLS, RLQS and ADS protos and upstream ratelimit's
//! xDS rule format (`RateLimitConfig`) in `proto/` with `protox` (a pure-Rust
//! protobuf compiler, so no system `protoc` is needed) and generates the tonic
//! servers and clients. The ADS server is generated too: the xDS tests run a
//! management server in Rust. The encoded descriptor set is written next to the
//! code for gRPC server reflection.
//!
//! It also assembles the Redis store's decision script, `decide.lua` in
//! `OUT_DIR`, from its parts in `src/store/redis/decide/` (one file per
//! algorithm and the driver; `prelude.lua` says why and in what order).

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
    "request",
    "sliding_window",
    "fixed_window",
    "token_bucket",
    "sliding_log",
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
    fs::write(out_dir.join("decide.lua"), script)
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto");
    let out_dir = PathBuf::from(env::var("OUT_DIR")?);
    assemble_decide(&out_dir)?;

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
