//! Redis Cluster routing, done here rather than by a client library's
//! cluster mode.
//!
//! Why: a script that counts must never be sent twice, and client cluster
//! modes retry on their own (fred's, for one, put the in-flight commands of
//! a dropped connection back in its retry buffer, and with a single attempt
//! allowed ended a connection for good on a routine `ASK`). Only this module
//! knows which answers mean "not run".
//!
//! So: one [`Node`] (a few connections that never resend) per
//! primary, and a slot table (16384 entries) read from `CLUSTER SLOTS` of any
//! reachable node. Redis answers `MOVED`, `ASK`, `TRYAGAIN` and
//! `CLUSTERDOWN` before running a script, so on those the call may safely go
//! again (see [`super::RedisStore`]): `MOVED` updates the slot and schedules a
//! refresh; `ASK` goes once to the named node after `ASKING`, without
//! touching the table; `TRYAGAIN` waits a few ms. Connection errors and
//! timeouts are never resent; they fail that slot group and schedule a
//! refresh. Refreshes are rate-limited ([`MIN_REFRESH_GAP`]) and also run
//! every [`REFRESH_EVERY`], so a failover that sends no `MOVED` is noticed.
//! Nodes that appear get clients; nodes that leave are closed.

use std::collections::HashMap;
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use parking_lot::{Mutex, RwLock};
use redis::Value;

use super::dial::{Dialer, Place};
use super::node::{Node, NodeName};
use super::url::Address;
use crate::store::StoreError;

/// Hash slots of a Redis Cluster.
const SLOTS: usize = 16384;
/// Refreshes asked for by failures come at most this often.
const MIN_REFRESH_GAP: Duration = Duration::from_millis(200);
/// The topology is read again this often regardless.
const REFRESH_EVERY: Duration = Duration::from_secs(2);
/// How long a node that owns no slot (one learned from `ASK`) is kept.
const KEEP_UNLISTED: Duration = Duration::from_secs(10);
/// How long one node may take to answer `CLUSTER SLOTS`.
const SLOTS_TIMEOUT: Duration = Duration::from_secs(1);

/// Which node serves each slot, and every node's clients.
struct Topology {
    slots: Vec<Option<Arc<Node>>>,
    nodes: HashMap<NodeName, Arc<Node>>,
}

/// The routing state of one Redis Cluster.
pub(super) struct Cluster {
    /// The URL's hosts: asked when no known node answers.
    seeds: Vec<Address>,
    /// Credentials and TLS of every node's connections.
    dialer: Arc<Dialer>,
    pool_size: usize,
    /// Read by every call (an `Arc` clone under a read lock); written by
    /// refreshes and `MOVED`.
    topology: RwLock<Topology>,
    /// When the last refresh began; `None` before the first. Also keeps
    /// two refreshes from running at once.
    refreshing: Mutex<RefreshState>,
}

#[derive(Default)]
struct RefreshState {
    last: Option<Instant>,
    running: bool,
}

impl Cluster {
    /// Reads the topology from the seeds (waiting at most `connect_timeout`)
    /// and starts the periodic refresh. A cluster not reachable yet gives an
    /// empty table: calls fail UNAVAILABLE until a refresh finds it.
    pub(super) async fn connect(
        dialer: Arc<Dialer>,
        seeds: Vec<Address>,
        pool_size: usize,
        connect_timeout: Duration,
    ) -> Arc<Cluster> {
        let cluster = Arc::new(Cluster {
            seeds,
            dialer,
            pool_size,
            topology: RwLock::new(Topology {
                slots: vec![None; SLOTS],
                nodes: HashMap::new(),
            }),
            refreshing: Mutex::new(RefreshState::default()),
        });
        // Each seed gets its share of the wait, so that unreachable seeds
        // cannot hold start-up longer than `connect_timeout` in all. (Not a
        // timeout around the refresh: a cancelled one could leave a seed's
        // client reconnecting for good.)
        let share = connect_timeout / u32::try_from(cluster.seeds.len().max(1)).unwrap_or(1);
        if let Err(e) = cluster.refresh(share).await {
            tracing::warn!(error = %e, "Redis Cluster topology not readable yet; requests fail UNAVAILABLE until it is");
        }
        tokio::spawn(refresh_periodically(Arc::downgrade(&cluster)));
        cluster
    }

    /// The node serving `slot`.
    pub(super) fn node_for(self: &Arc<Self>, slot: u16) -> Result<Arc<Node>, StoreError> {
        let found = self.topology.read().slots[usize::from(slot) % SLOTS].clone();
        found.ok_or_else(|| {
            self.refresh_soon();
            StoreError::Unavailable(format!("no Redis Cluster node serves slot {slot}"))
        })
    }

    /// Every node, e.g. to load scripts or report readiness.
    pub(super) fn nodes(&self) -> Vec<Arc<Node>> {
        self.topology.read().nodes.values().cloned().collect()
    }

    /// The node at `address`, created (and connecting) if it is new.
    pub(super) fn node_at(&self, address: &str) -> Result<Arc<Node>, StoreError> {
        if let Some(node) = self.topology.read().nodes.get(address) {
            return Ok(node.clone());
        }
        // Looked up again and built under the write lock: of many calls
        // redirected to a new node at once, only one builds it (a node
        // built and dropped would keep its connections open for good).
        let mut topology = self.topology.write();
        if let Some(node) = topology.nodes.get(address) {
            return Ok(node.clone());
        }
        let node = Arc::new(self.new_node(address)?);
        topology.nodes.insert(node.name().clone(), node.clone());
        Ok(node)
    }

    /// `MOVED`: the slot lives at `address` now.
    pub(super) fn moved(
        self: &Arc<Self>,
        slot: u16,
        address: &str,
    ) -> Result<Arc<Node>, StoreError> {
        let node = self.node_at(address)?;
        self.topology.write().slots[usize::from(slot) % SLOTS] = Some(node.clone());
        self.refresh_soon();
        Ok(node)
    }

    /// Whether any node has a connection up. A cluster with one shard down
    /// still serves the others' slots, so it stays ready: taking this
    /// replica out of rotation would not bring the shard back.
    pub(super) fn is_ready(&self) -> bool {
        self.topology
            .read()
            .nodes
            .values()
            .any(|n| n.is_connected())
    }

    /// Closes every node.
    pub(super) fn quit(&self) {
        for node in self.nodes() {
            node.quit();
        }
    }

    /// Schedules a refresh in the background, unless one ran lately.
    pub(super) fn refresh_soon(self: &Arc<Self>) {
        {
            let mut state = self.refreshing.lock();
            if state.running || state.last.is_some_and(|t| t.elapsed() < MIN_REFRESH_GAP) {
                return;
            }
            state.running = true;
            state.last = Some(Instant::now());
        }
        let cluster = self.clone();
        tokio::spawn(async move {
            if let Err(e) = cluster.read_topology(SLOTS_TIMEOUT).await {
                tracing::warn!(error = %e, "Redis Cluster topology refresh failed");
            }
            cluster.refreshing.lock().running = false;
        });
    }

    /// A refresh now (waiting for a running one's turn is not needed: the
    /// caller is start-up or the periodic task).
    async fn refresh(&self, wait: Duration) -> Result<(), StoreError> {
        {
            let mut state = self.refreshing.lock();
            if state.running {
                return Ok(());
            }
            state.running = true;
            state.last = Some(Instant::now());
        }
        let result = self.read_topology(wait).await;
        self.refreshing.lock().running = false;
        result
    }

    /// Asks the known nodes (connected ones first), then the seeds, for
    /// `CLUSTER SLOTS`, and installs the first answer.
    async fn read_topology(&self, wait: Duration) -> Result<(), StoreError> {
        let mut known = self.nodes();
        known.sort_by_key(|n| !n.is_connected());
        let mut last = StoreError::Unavailable("no Redis Cluster node to ask".into());
        for node in &known {
            match self.ask(node, wait).await {
                Ok(ranges) => return self.install(ranges),
                Err(e) => last = e,
            }
        }
        for seed in &self.seeds {
            let address = seed.to_string();
            if known.iter().any(|n| **n.name() == address) {
                continue;
            }
            let node = self.new_node(&address)?;
            let answer = if node.wait_connected(wait).await {
                self.ask(&node, wait).await
            } else {
                Err(node.down())
            };
            // Kept only if the topology names it (as a fresh node then).
            node.quit();
            match answer {
                Ok(ranges) => return self.install(ranges),
                Err(e) => last = e,
            }
        }
        Err(last)
    }

    /// `CLUSTER SLOTS` of one node: `(first, last, address)` per range.
    async fn ask(
        &self,
        node: &Node,
        wait: Duration,
    ) -> Result<Vec<(u16, u16, String)>, StoreError> {
        let mut slots = redis::cmd("CLUSTER");
        slots.arg("SLOTS");
        let reply: Value = tokio::time::timeout(wait, node.command(&slots))
            .await
            .map_err(|_| StoreError::Timeout(wait))??;
        let asked_host = node
            .name()
            .rsplit_once(':')
            .map_or("", |(h, _)| h)
            .to_owned();
        parse_slots(reply, &asked_host).ok_or_else(|| {
            StoreError::Unavailable(format!(
                "unexpected CLUSTER SLOTS reply from {}",
                node.name()
            ))
        })
    }

    /// Makes `ranges` the slot table: new primaries get clients, primaries
    /// that left are closed.
    fn install(&self, ranges: Vec<(u16, u16, String)>) -> Result<(), StoreError> {
        let mut nodes: HashMap<NodeName, Arc<Node>> = HashMap::new();
        let mut slots = vec![None; SLOTS];
        // The whole swap under the write lock, so no node that `node_at`
        // adds meanwhile is lost (and left connected) by the swap.
        let mut topology = self.topology.write();
        let old = &topology.nodes;
        for (first, last, address) in ranges {
            let node = match nodes
                .get(address.as_str())
                .or_else(|| old.get(address.as_str()))
            {
                Some(node) => node.clone(),
                None => match self.new_node(&address) {
                    Ok(node) => Arc::new(node),
                    Err(e) => {
                        // Close what this attempt built; the old table stays.
                        let built: Vec<Arc<Node>> = nodes
                            .into_values()
                            .filter(|n| !old.contains_key(n.name()))
                            .collect();
                        drop(topology);
                        for node in built {
                            node.quit();
                        }
                        return Err(e);
                    }
                },
            };
            nodes.insert(node.name().clone(), node.clone());
            let range = usize::from(first)..=usize::from(last).min(SLOTS - 1);
            if let Some(entries) = slots.get_mut(range) {
                entries.fill(Some(node.clone()));
            }
        }
        let mut gone = Vec::new();
        for (name, node) in std::mem::take(&mut topology.nodes) {
            if nodes.contains_key(&name) {
                continue;
            }
            if node.age() < KEEP_UNLISTED {
                // Learned from an ASK: the target of a migration owns no
                // slot yet, and more ASKs for it are likely.
                nodes.insert(name, node);
            } else {
                gone.push(node);
            }
        }
        *topology = Topology { slots, nodes };
        drop(topology);
        // A node that answered MOVED a moment ago may be a replica now;
        // calls holding it end when its last holder lets go (dropping the
        // last `Arc` closes its connections).
        drop(gone);
        Ok(())
    }

    fn new_node(&self, address: &str) -> Result<Node, StoreError> {
        let at = Address::parse(address).map_err(|e| {
            StoreError::Unavailable(format!("bad Redis Cluster address '{address}': {e}"))
        })?;
        Ok(Node::new(
            address.into(),
            self.dialer.clone(),
            Place::At(at),
            self.pool_size,
        ))
    }
}

/// Reads the topology every [`REFRESH_EVERY`] until the cluster is dropped.
async fn refresh_periodically(cluster: Weak<Cluster>) {
    loop {
        tokio::time::sleep(REFRESH_EVERY).await;
        let Some(cluster) = cluster.upgrade() else {
            return;
        };
        if let Err(e) = cluster.refresh(SLOTS_TIMEOUT).await {
            tracing::warn!(error = %e, "Redis Cluster topology refresh failed");
        }
    }
}

/// `CLUSTER SLOTS`: `[[first, last, [host, port, id, …], replicas…], …]`. An
/// empty host means "the node you asked".
pub(super) fn parse_slots(reply: Value, asked_host: &str) -> Option<Vec<(u16, u16, String)>> {
    let Value::Array(ranges) = reply else {
        return None;
    };
    let mut out = Vec::with_capacity(ranges.len());
    for range in ranges {
        let Value::Array(parts) = range else {
            return None;
        };
        let mut parts = parts.into_iter();
        let first = u16::try_from(int(parts.next()?)?).ok()?;
        let last = u16::try_from(int(parts.next()?)?).ok()?;
        let Value::Array(primary) = parts.next()? else {
            return None;
        };
        let mut primary = primary.into_iter();
        let host = match primary.next()? {
            Value::BulkString(bytes) => String::from_utf8(bytes).ok()?,
            Value::SimpleString(text) => text,
            _ => return None,
        };
        let port = int(primary.next()?)?;
        let host = if host.is_empty() || host == "?" {
            asked_host.to_owned()
        } else {
            host
        };
        out.push((first, last, format!("{host}:{port}")));
    }
    Some(out)
}

fn int(value: Value) -> Option<i64> {
    match value {
        Value::Int(n) => Some(n),
        _ => None,
    }
}

/// The hash slot of `key`: CRC16 (XMODEM) of the key, or of its hash tag
/// (what lies between the first `{` and the next `}`, when not empty),
/// modulo 16384.
pub(super) fn slot(key: &[u8]) -> u16 {
    let tagged = key.iter().position(|&b| b == b'{').and_then(|open| {
        let rest = &key[open + 1..];
        let close = rest.iter().position(|&b| b == b'}')?;
        (close > 0).then(|| &rest[..close])
    });
    crc16::State::<crc16::XMODEM>::calculate(tagged.unwrap_or(key)) % SLOTS as u16
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cluster_slots_replies_become_ranges() {
        let node = |host: &str, port: i64| {
            Value::Array(vec![
                Value::BulkString(host.into()),
                Value::Int(port),
                Value::BulkString("id".into()),
            ])
        };
        let reply = Value::Array(vec![
            Value::Array(vec![
                Value::Int(0),
                Value::Int(5460),
                node("10.0.0.1", 7000),
                node("10.0.0.4", 7003),
            ]),
            Value::Array(vec![Value::Int(5461), Value::Int(16383), node("", 7001)]),
        ]);
        assert_eq!(
            parse_slots(reply, "10.0.0.9"),
            Some(vec![
                (0, 5460, "10.0.0.1:7000".into()),
                (5461, 16383, "10.0.0.9:7001".into())
            ])
        );
        assert_eq!(parse_slots(Value::SimpleString("x".into()), ""), None);
    }

    #[test]
    fn slots_follow_redis_cluster_hashing() {
        // Figures from the Redis Cluster specification and CLUSTER KEYSLOT.
        assert_eq!(slot(b"123456789"), 0x31C3);
        assert_eq!(slot(b"foo"), 12182);
        assert_eq!(slot(b"{user1000}.following"), slot(b"user1000"));
        assert_ne!(slot(b"{}a"), slot(b"a"));
        assert_eq!(slot(b"a{b}c{d}"), slot(b"b"));
    }
}
