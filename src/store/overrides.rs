//! Limits set at run time (the admin `/overrides/{domain}` API): one
//! override replaces the matched rule's limit for requests whose descriptor
//! equals its own exactly. They live in the counter store, so that in Redis
//! every replica shares them and they outlast restarts; each replica keeps
//! a copy of all of them (a [`OverrideSet`]) and reloads it when the
//! store's version changes.
//!
//! [`OverrideBook`] is the whole bookkeeping (the per-domain cap, expiry,
//! the version) for a store that keeps them in process.

mod in_redis;

use std::collections::HashMap;

use parking_lot::Mutex;
use serde::{Deserialize, Serialize};

use crate::limiter::Unit;

/// One `key=value` of an override's descriptor.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct OverrideEntry {
    /// The entry's key.
    pub key: String,
    /// The entry's value, matched exactly (no wildcard).
    pub value: String,
}

/// A limit set at run time for one exact descriptor of one domain.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Override {
    /// The rules domain.
    pub domain: String,
    /// The descriptor, entry by entry, in request order.
    pub descriptor: Vec<OverrideEntry>,
    /// The limit that replaces the rule's.
    pub requests_per_unit: u64,
    /// Its unit: `second`, `minute`, `hour`, `day`, `week`, `month`, `year`.
    pub unit: String,
    /// When it stops applying (Unix milliseconds); never when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_at_ms: Option<u64>,
    /// Who set it, as the audit line names the caller.
    pub set_by: String,
    /// When it was set (Unix milliseconds).
    pub set_at_ms: u64,
}

impl Override {
    /// The canonical name of its descriptor in its domain: the store's
    /// field, injective (a JSON array of strings cannot be read two ways).
    pub fn field(&self) -> String {
        field(&self.domain, &self.descriptor)
    }

    /// Its unit as a [`Unit`] (`None` for a name that is not one).
    pub fn unit(&self) -> Option<Unit> {
        Unit::from_proto_name(&self.unit)
    }

    /// Whether it applies at `now_ms`.
    pub fn live_at(&self, now_ms: u64) -> bool {
        self.expires_at_ms.is_none_or(|at| now_ms < at)
    }
}

/// The store field of `descriptor` in `domain` (see [`Override::field`]).
pub fn field(domain: &str, descriptor: &[OverrideEntry]) -> String {
    let mut parts: Vec<&str> = vec![domain];
    for entry in descriptor {
        parts.push(&entry.key);
        parts.push(&entry.value);
    }
    serde_json::to_string(&parts).unwrap_or_default()
}

/// A domain has its maximum count of overrides already.
#[derive(Clone, Debug, thiserror::Error)]
#[error(
    "domain {domain} has {max} overrides already, the most allowed (setting overrides_max_per_domain); delete one first"
)]
pub struct DomainFull {
    /// The domain.
    pub domain: String,
    /// The cap.
    pub max: usize,
}

/// Every override a store holds, and the store's version of them.
#[derive(Clone, Debug, Default)]
pub struct OverrideSet {
    /// Changes whenever an override is set or deleted.
    pub version: u64,
    /// By [`Override::field`].
    pub by_field: HashMap<String, Override>,
}

impl OverrideSet {
    /// A set of `overrides` at `version`.
    pub fn new(version: u64, overrides: impl IntoIterator<Item = Override>) -> Self {
        Self {
            version,
            by_field: overrides.into_iter().map(|o| (o.field(), o)).collect(),
        }
    }

    /// The overrides of `domain` that apply at `now_ms`, in descriptor order.
    pub fn of_domain(&self, domain: &str, now_ms: u64) -> Vec<&Override> {
        let mut found: Vec<&Override> = self
            .by_field
            .values()
            .filter(|o| o.domain == domain && o.live_at(now_ms))
            .collect();
        found.sort_by_key(|o| o.field());
        found
    }

    /// The override of exactly these entries in `domain` that applies at
    /// `now_ms`, if any.
    pub fn find<'e>(
        &self,
        domain: &str,
        entries: impl Iterator<Item = (&'e str, &'e str)>,
        now_ms: u64,
    ) -> Option<&Override> {
        if self.by_field.is_empty() {
            return None;
        }
        let mut parts: Vec<&str> = vec![domain];
        for (key, value) in entries {
            parts.push(key);
            parts.push(value);
        }
        let field = serde_json::to_string(&parts).ok()?;
        self.by_field.get(&field).filter(|o| o.live_at(now_ms))
    }
}

/// The overrides of a store that keeps them in process.
#[derive(Debug, Default)]
pub struct OverrideBook {
    set: Mutex<OverrideSet>,
}

impl OverrideBook {
    /// Sets `new` (replacing the override of the same descriptor, which is
    /// returned), unless its domain already has `max` live overrides.
    /// Expired overrides are dropped first.
    pub fn put(
        &self,
        new: Override,
        max: usize,
        now_ms: u64,
    ) -> Result<Option<Override>, DomainFull> {
        let mut set = self.set.lock();
        set.by_field.retain(|_, o| o.live_at(now_ms));
        let field = new.field();
        if !set.by_field.contains_key(&field) {
            let count = set
                .by_field
                .values()
                .filter(|o| o.domain == new.domain)
                .count();
            if count >= max {
                return Err(DomainFull {
                    domain: new.domain,
                    max,
                });
            }
        }
        set.version += 1;
        Ok(set.by_field.insert(field, new))
    }

    /// Deletes the override of `descriptor` in `domain`, returning it.
    pub fn delete(&self, domain: &str, descriptor: &[OverrideEntry]) -> Option<Override> {
        let mut set = self.set.lock();
        let removed = set.by_field.remove(&field(domain, descriptor));
        if removed.is_some() {
            set.version += 1;
        }
        removed
    }

    /// The version of the overrides.
    pub fn version(&self) -> u64 {
        self.set.lock().version
    }

    /// A copy of every override.
    pub fn load(&self) -> OverrideSet {
        self.set.lock().clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tenant(value: &str, requests: u64, expires_at_ms: Option<u64>) -> Override {
        Override {
            domain: "api".into(),
            descriptor: vec![OverrideEntry {
                key: "tenant".into(),
                value: value.into(),
            }],
            requests_per_unit: requests,
            unit: "minute".into(),
            expires_at_ms,
            set_by: "test".into(),
            set_at_ms: 0,
        }
    }

    #[test]
    fn a_put_replaces_the_same_descriptor_and_returns_the_one_before() {
        let book = OverrideBook::default();
        assert_eq!(book.put(tenant("acme", 5, None), 10, 0).unwrap(), None);
        let before = book.put(tenant("acme", 7, None), 10, 0).unwrap();
        assert_eq!(before.map(|o| o.requests_per_unit), Some(5));
        let set = book.load();
        assert_eq!(set.by_field.len(), 1);
        assert_eq!(set.version, 2);
    }

    #[test]
    fn the_cap_refuses_a_new_descriptor_but_not_a_replacement() {
        let book = OverrideBook::default();
        book.put(tenant("a", 1, None), 2, 0).unwrap();
        book.put(tenant("b", 1, None), 2, 0).unwrap();
        let refused = book.put(tenant("c", 1, None), 2, 0).unwrap_err();
        assert!(refused.to_string().contains("overrides_max_per_domain"));
        assert!(book.put(tenant("b", 9, None), 2, 0).is_ok());
        assert_eq!(book.version(), 3);
    }

    #[test]
    fn expired_overrides_stop_applying_and_free_their_place() {
        let book = OverrideBook::default();
        book.put(tenant("a", 1, Some(1_000)), 1, 0).unwrap();
        assert_eq!(book.load().of_domain("api", 999).len(), 1);
        assert!(book.load().of_domain("api", 1_000).is_empty());
        assert!(book.put(tenant("b", 1, None), 1, 1_000).is_ok());
    }

    #[test]
    fn a_delete_removes_only_that_descriptor_and_bumps_the_version() {
        let book = OverrideBook::default();
        book.put(tenant("a", 1, None), 5, 0).unwrap();
        book.put(tenant("b", 1, None), 5, 0).unwrap();
        let gone = book.delete("api", &tenant("a", 0, None).descriptor);
        assert_eq!(gone.map(|o| o.requests_per_unit), Some(1));
        assert_eq!(book.delete("api", &tenant("a", 0, None).descriptor), None);
        assert_eq!(book.load().of_domain("api", 0).len(), 1);
        assert_eq!(book.version(), 3);
    }

    #[test]
    fn fields_are_injective_over_separators() {
        let a = field("d", &tenant("x\",\"y", 0, None).descriptor);
        let mut two = tenant("x", 0, None).descriptor;
        two.push(OverrideEntry {
            key: "y".into(),
            value: String::new(),
        });
        assert_ne!(a, field("d", &two));
    }
}
