//! Overrides in Redis (`overrides.lua`): one HASH holding every override
//! and a version counter beside it, both under one hash tag so that a
//! Cluster keeps them in one slot. Writes are one script call each (the
//! per-domain cap is checked and the version bumped in the same call);
//! replicas poll the version, one GET, and load the HASH only when it
//! changed.

use std::sync::Arc;

use serde::Deserialize;

use super::RedisStore;
use super::call::{Shared, Target};
use super::node::{Eval, Script};
use crate::store::{Override, OverrideEntry, OverrideError, OverrideSet, StoreError, overrides};

const OVERRIDES: &str = include_str!("overrides.lua");

/// The two keys, under the store's prefix.
fn keys(prefix: &str) -> [String; 2] {
    [
        format!("{prefix}{{sluice-overrides}}:all"),
        format!("{prefix}{{sluice-overrides}}:version"),
    ]
}

/// One call of `overrides.lua` with `args`.
async fn call(store: &RedisStore, args: &[&str]) -> Result<Vec<i64>, StoreError> {
    let keys = keys(&store.prefix);
    let shared: &Arc<Shared> = &store.shared;
    let slot = shared.slot(Target::Main, &keys[0]);
    let mut eval = Eval::new(&Script::new(OVERRIDES), &keys, slot, args.len());
    eval.cmd.arg(args);
    shared
        .clone()
        .send(Target::Main, eval, super::call::Guard::Breaker)
        .await
}

/// A text reply (space-padded JSON packed in 8-byte integers) read as `T`.
fn text<T: for<'a> Deserialize<'a>>(reply: &[i64]) -> Result<T, StoreError> {
    let bytes: Vec<u8> = reply.iter().flat_map(|n| n.to_le_bytes()).collect();
    serde_json::from_slice(&bytes).map_err(|e| {
        StoreError::Unavailable(format!("overrides.lua answered unreadable JSON: {e}"))
    })
}

#[derive(Deserialize)]
struct Put {
    full: bool,
    #[serde(default)]
    before: Option<Override>,
}

#[derive(Deserialize)]
struct Deleted {
    before: Option<Override>,
}

#[derive(Deserialize)]
struct Loaded {
    version: u64,
    all: Vec<Override>,
}

pub(super) async fn put(
    store: &RedisStore,
    new: Override,
    max: usize,
) -> Result<Option<Override>, OverrideError> {
    let value = serde_json::to_string(&new).map_err(|e| StoreError::Unavailable(e.to_string()))?;
    let (max_text, now) = (max.to_string(), store.shared.clock.now().to_string());
    let reply = call(
        store,
        &["put", &new.field(), &value, &new.domain, &max_text, &now],
    )
    .await?;
    let put: Put = text(&reply)?;
    if put.full {
        return Err(OverrideError::Full {
            domain: new.domain,
            max,
        });
    }
    Ok(put.before)
}

pub(super) async fn delete(
    store: &RedisStore,
    domain: &str,
    descriptor: &[OverrideEntry],
) -> Result<Option<Override>, StoreError> {
    let reply = call(store, &["delete", &overrides::field(domain, descriptor)]).await?;
    Ok(text::<Deleted>(&reply)?.before)
}

pub(super) async fn version(store: &RedisStore) -> Result<u64, StoreError> {
    match call(store, &["version"]).await?[..] {
        [version] => Ok(u64::try_from(version).unwrap_or(0)),
        ref other => Err(StoreError::Unavailable(format!(
            "overrides.lua answered {} values for the version",
            other.len()
        ))),
    }
}

pub(super) async fn load(store: &RedisStore) -> Result<OverrideSet, StoreError> {
    let loaded: Loaded = text(&call(store, &["load"]).await?)?;
    Ok(OverrideSet::new(loaded.version, loaded.all))
}
