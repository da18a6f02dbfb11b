//! A statsd listener for the stats tests (`tests/compat/upstream_stats.rs`,
//! `tests/envoy/envoy_gateway/`): it binds a loopback port over UDP or TCP (as
//! gostats sends by default), keeps every line it receives, and lets a test
//! wait, with a deadline, for a given line.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use tokio::io::AsyncReadExt;
use tokio::net::{TcpListener, UdpSocket};
use tokio::sync::Notify;
use tokio::task::JoinHandle;

/// A listener collecting statsd lines.
pub struct StatsdListener {
    pub addr: SocketAddr,
    received: Arc<Received>,
    task: JoinHandle<()>,
}

#[derive(Default)]
struct Received {
    text: Mutex<String>,
    /// Woken on every arrival, so a waiting test looks again.
    arrived: Notify,
}

impl Received {
    fn push(&self, bytes: &[u8]) {
        let mut text = self.text.lock();
        text.push_str(&String::from_utf8_lossy(bytes));
        // A UDP datagram ends its last line without a newline.
        if !text.ends_with('\n') {
            text.push('\n');
        }
        drop(text);
        self.arrived.notify_waiters();
    }
}

impl Drop for StatsdListener {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl StatsdListener {
    /// Listens over UDP on a free loopback port.
    pub async fn udp() -> Self {
        let socket = UdpSocket::bind("127.0.0.1:0").await.unwrap();
        let addr = socket.local_addr().unwrap();
        let received = Arc::new(Received::default());
        let into = received.clone();
        let task = tokio::spawn(async move {
            let mut buf = vec![0u8; 65536];
            while let Ok(n) = socket.recv(&mut buf).await {
                into.push(&buf[..n]);
            }
        });
        Self {
            addr,
            received,
            task,
        }
    }

    /// Listens over TCP on a free loopback port, taking any number of
    /// connections.
    pub async fn tcp() -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let received = Arc::new(Received::default());
        let into = received.clone();
        let task = tokio::spawn(async move {
            while let Ok((mut conn, _)) = listener.accept().await {
                let into = into.clone();
                tokio::spawn(async move {
                    let mut buf = vec![0u8; 65536];
                    while let Ok(n @ 1..) = conn.read(&mut buf).await {
                        into.push(&buf[..n]);
                    }
                });
            }
        });
        Self {
            addr,
            received,
            task,
        }
    }

    /// Everything received so far.
    pub fn text(&self) -> String {
        self.received.text.lock().clone()
    }

    /// Waits until a line equal to `want` has arrived, for at most
    /// `deadline`; returns everything received.
    pub async fn wait_for_line(&self, want: &str, deadline: Duration) -> String {
        let until = tokio::time::Instant::now() + deadline;
        loop {
            let arrived = self.received.arrived.notified();
            let text = self.text();
            if text.lines().any(|l| l == want) {
                return text;
            }
            assert!(
                tokio::time::timeout_at(until, arrived).await.is_ok(),
                "no `{want}` within {deadline:?} in:\n{text}"
            );
        }
    }
}
