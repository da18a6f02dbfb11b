//! Checks of the Redis test harness itself: it starts real `redis-server`
//! processes, and they never outlive their owner.

use crate::support::redis;

use std::io;
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::thread;
use std::time::{Duration, Instant};

use redis::{
    CLUSTER_SLOTS, RedisCluster, RedisServer, Reply, accepts_connections, command, key_slot, ping,
};

/// Polls `condition` until it holds or `timeout` passes.
fn eventually(timeout: Duration, mut condition: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + timeout;
    loop {
        if condition() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        thread::sleep(Duration::from_millis(20));
    }
}

fn process_exists(pid: u32) -> bool {
    Command::new("kill")
        .args(["-0", &pid.to_string()])
        .stderr(Stdio::null())
        .status()
        .expect("run kill -0")
        .success()
}

#[test]
fn single_server_answers_ping_and_set_get() {
    let server = RedisServer::start();
    assert_ne!(server.port(), 6379);
    assert_eq!(server.url(), format!("redis://127.0.0.1:{}", server.port()));
    assert_eq!(server.command(&["PING"]), "PONG");
    assert_eq!(server.command(&["SET", "greeting", "hello"]), "OK");
    assert_eq!(
        server.query(&["GET", "greeting"]),
        Reply::Bulk(b"hello".to_vec())
    );
    assert_eq!(server.query(&["GET", "missing"]), Reply::Nil);
    assert_eq!(server.command(&["KEYS", "*"]), "greeting");
    assert!(
        server
            .command(&["INFO", "commandstats"])
            .contains("cmdstat_set:calls=1")
    );
    assert_eq!(server.redis_cli(&["GET", "greeting"]).trim(), "hello");
    // No persistence, and the server lives in its own directory.
    assert_eq!(server.redis_cli(&["CONFIG", "GET", "save"]).trim(), "save");
    let dir = server.command(&["CONFIG", "GET", "dir"]);
    assert!(
        dir.ends_with(server.dir().to_str().unwrap()),
        "{dir:?} vs {:?}",
        server.dir()
    );
    assert_eq!(
        server.command(&["CONFIG", "GET", "appendonly"]),
        "appendonly\nno"
    );
}

#[test]
fn stop_then_restart_on_the_same_port() {
    let mut server = RedisServer::start();
    let port = server.port();
    let first_pid = server.pid();
    // An open connection sees the kill.
    let mut conn = server.connect();
    assert_eq!(
        conn.call(&["SET", "k", "v"]).unwrap(),
        Reply::Simple("OK".into())
    );

    server.stop();
    assert!(!server.is_running());
    assert!(
        !accepts_connections(port),
        "port {port} still open after stop"
    );
    assert!(!process_exists(first_pid));
    assert!(conn.call(&["PING"]).is_err());

    server.restart();
    assert_eq!(server.port(), port);
    assert_ne!(server.pid(), first_pid);
    assert_eq!(command(port, &["PING"]), "PONG");
    // Nothing was persisted across the kill.
    assert_eq!(command(port, &["GET", "k"]), "(nil)");

    // A restart of a running server kills it first.
    server.restart();
    assert_eq!(command(port, &["PING"]), "PONG");
}

#[test]
fn pause_blocks_and_resume_recovers() {
    let server = RedisServer::start();
    server.pause();
    let mut conn = server.connect(); // the kernel still accepts connections
    conn.set_timeout(Some(Duration::from_millis(200))).unwrap();
    let started = Instant::now();
    let err = conn
        .call(&["PING"])
        .expect_err("a paused server must not answer");
    assert!(
        matches!(
            err.kind(),
            io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
        ),
        "{err:?}"
    );
    assert!(started.elapsed() >= Duration::from_millis(150));
    assert!(!ping(server.port(), Duration::from_millis(100)));

    server.resume();
    assert!(ping(server.port(), Duration::from_secs(2)));
    assert_eq!(server.command(&["PING"]), "PONG");
}

#[test]
fn dropping_a_paused_server_kills_it() {
    let server = RedisServer::start();
    let (port, pid) = (server.port(), server.pid());
    server.pause();
    drop(server);
    assert!(!accepts_connections(port));
    assert!(!process_exists(pid));
}

#[test]
fn acl_server_requires_authentication() {
    let server = RedisServer::start_with(&[
        "--user", "alice", "on", ">secret", "~*", "&*", "+@all", "--user", "default", "off",
    ]);
    assert_eq!(
        server.url_with_auth("alice", "se:cr@t"),
        format!("redis://alice:se%3Acr%40t@127.0.0.1:{}", server.port())
    );
    let reply = server.query(&["GET", "k"]);
    assert!(
        matches!(&reply, Reply::Error(e) if e.starts_with("NOAUTH")),
        "{reply:?}"
    );

    let mut conn = server.connect();
    let wrong = conn.call(&["AUTH", "alice", "nope"]).unwrap();
    assert!(wrong.is_error(), "{wrong:?}");
    assert_eq!(
        conn.call(&["AUTH", "alice", "secret"]).unwrap(),
        Reply::Simple("OK".into())
    );
    assert_eq!(
        conn.call(&["SET", "k", "v"]).unwrap(),
        Reply::Simple("OK".into())
    );
    assert_eq!(
        conn.call(&["ACL", "WHOAMI"]).unwrap(),
        Reply::Bulk(b"alice".to_vec())
    );

    let requirepass = RedisServer::start_with(&["--requirepass", "hunter2"]);
    assert!(requirepass.command(&["PING"]).starts_with("(error) NOAUTH"));
    let mut conn = requirepass.connect();
    assert_eq!(
        conn.call(&["AUTH", "hunter2"]).unwrap(),
        Reply::Simple("OK".into())
    );
    assert_eq!(conn.call(&["PING"]).unwrap(), Reply::Simple("PONG".into()));
}

#[test]
fn cluster_has_every_slot_and_every_node_answers() {
    let started = Instant::now();
    let cluster = RedisCluster::start();
    eprintln!("cluster ready in {:?}", started.elapsed());
    let ports = cluster.ports();
    assert_eq!(ports.len(), 3);
    assert_eq!(
        cluster.url(),
        format!(
            "redis-cluster://127.0.0.1:{},127.0.0.1:{},127.0.0.1:{}",
            ports[0], ports[1], ports[2]
        )
    );
    for &port in &ports {
        assert_ne!(port, 6379);
        assert_eq!(command(port, &["PING"]), "PONG");
        let info = command(port, &["CLUSTER", "INFO"]);
        assert!(info.contains("cluster_state:ok"), "{info}");
        assert!(
            info.contains(&format!("cluster_slots_assigned:{CLUSTER_SLOTS}")),
            "{info}"
        );
        assert!(info.contains("cluster_size:3"), "{info}");
    }

    for key in ["a", "b", "user:{42}:count", "{42}", "sluice:xyz", ""] {
        let slot = key_slot(key.as_bytes());
        assert_eq!(
            command(ports[0], &["CLUSTER", "KEYSLOT", key]),
            slot.to_string(),
            "slot of {key:?}"
        );
        let owner = cluster.port_for_key(key);
        assert_eq!(command(owner, &["SET", key, "v"]), "OK");
        for &other in ports.iter().filter(|&&p| p != owner) {
            let moved = command(other, &["GET", key]);
            assert_eq!(moved, format!("(error) MOVED {slot} 127.0.0.1:{owner}"));
        }
    }
    // Keys spread over all three masters.
    let owners: std::collections::HashSet<u16> = (0..64)
        .map(|i| cluster.port_for_key(&format!("key{i}")))
        .collect();
    assert_eq!(owners.len(), 3);
}

#[test]
fn dropping_kills_the_process_and_frees_the_port() {
    let server = RedisServer::start();
    let (port, pid, dir) = (server.port(), server.pid(), server.dir().to_owned());
    assert!(process_exists(pid));
    drop(server);
    assert!(
        !accepts_connections(port),
        "port {port} still open after drop"
    );
    assert!(!process_exists(pid), "redis-server {pid} survived drop");
    assert!(!dir.exists());
}

/// Runs this test binary's `child_leaks_a_server` in a new process and
/// checks that its redis-server died with it.
fn leak_and_check(mode: &str) {
    let output = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            // The test's name in this binary: its module, then its own.
            "harness::child_leaks_a_server",
            "--ignored",
            "--nocapture",
        ])
        .env("REDIS_HARNESS_CHILD", mode)
        .stdin(Stdio::null())
        .output()
        .expect("run the child test process");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let line = stdout
        .lines()
        .find_map(|l| l.strip_prefix("LEAKED "))
        .unwrap_or_else(|| panic!("child printed no server ({}):\n{stdout}", output.status));
    let mut fields = line.split(' ');
    let port: u16 = fields.next().unwrap().parse().unwrap();
    let pid: u32 = fields.next().unwrap().parse().unwrap();
    let dir = std::path::PathBuf::from(fields.next().unwrap());
    assert!(
        eventually(Duration::from_secs(5), || !process_exists(pid)),
        "redis-server {pid} outlived its test process ({mode})"
    );
    assert!(!accepts_connections(port));
    assert!(
        eventually(Duration::from_secs(5), || !dir.exists()),
        "{dir:?} left behind ({mode})"
    );
}

#[test]
fn a_server_in_a_static_dies_with_the_process() {
    leak_and_check("static");
}

#[test]
fn a_server_dies_with_an_aborted_process() {
    leak_and_check("abort");
}

/// Not a test on its own: the child process of `leak_and_check`.
#[test]
#[ignore = "run by leak_and_check in a child process"]
fn child_leaks_a_server() {
    static SERVER: OnceLock<RedisServer> = OnceLock::new();
    let Ok(mode) = std::env::var("REDIS_HARNESS_CHILD") else {
        return;
    };
    let server = SERVER.get_or_init(RedisServer::start);
    assert_eq!(server.command(&["PING"]), "PONG");
    println!(
        "LEAKED {} {} {}",
        server.port(),
        server.pid(),
        server.dir().display()
    );
    if mode == "abort" {
        use std::io::Write as _;
        std::io::stdout().flush().unwrap();
        std::process::abort();
    }
}
