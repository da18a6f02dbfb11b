//! Compiles the trimmed Envoy RLS and RLQS protos in `proto/` with `protox` (a pure-Rust
//! protobuf compiler, so no system `protoc` is needed) and generates the tonic
//! server and client. The encoded descriptor set is written next to the code for
//! gRPC server reflection.

use std::{env, fs, path::PathBuf};

const PROTOS: &[&str] = &[
    "envoy/service/ratelimit/v3/rls.proto",
    "envoy/service/rate_limit_quota/v3/rlqs.proto",
];

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto");
    let out_dir = PathBuf::from(env::var("OUT_DIR")?);

    let mut compiler = protox::Compiler::new(["proto"])?;
    compiler.include_imports(true).include_source_info(false);
    compiler.open_files(PROTOS)?;
    fs::write(
        out_dir.join("sluice_descriptor.bin"),
        compiler.encode_file_descriptor_set(),
    )?;

    tonic_prost_build::configure()
        .build_server(true)
        .build_client(true)
        .compile_fds(compiler.file_descriptor_set())?;
    Ok(())
}
