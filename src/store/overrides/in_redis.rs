//! Overrides in Redis (`overrides.lua`): one HASH holding every override
//! and a version counter beside it, both under one hash tag so that a
//! Cluster keeps them in one slot. Writes are one script call each (the
//! per-domain cap is checked and the version bumped in the same call);
//! replicas poll the version, one GET, and load the HASH only when it
//! changed. The calls go through the store's [`ScriptRunner`] (its
//! connections, routing and breakers; no Redis client here), which
//! `CounterStore`'s override methods use whenever a store has one.

use std::sync::LazyLock;

use serde::Deserialize;

use super::{DomainFull, Override, OverrideEntry, OverrideSet, field};
use crate::store::{LuaScript, OverrideError, ScriptRunner, StoreError};

static OVERRIDES: LazyLock<LuaScript> =
    LazyLock::new(|| LuaScript::new(include_str!("../redis/overrides.lua")));

/// One call of `overrides.lua` with `args`, on the HASH under the store's
/// prefix (the version key is derived from it in the script).
async fn call(runner: &ScriptRunner, args: &[&str]) -> Result<Vec<i64>, StoreError> {
    let key = format!("{}{{sluice-overrides}}", runner.key_prefix());
    let args = args.iter().map(|a| (*a).to_owned()).collect();
    runner.run(&OVERRIDES, key, args).await
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

impl ScriptRunner {
    /// [`crate::store::CounterStore::put_override`] in Redis.
    pub async fn put_override(
        &self,
        new: Override,
        max: usize,
    ) -> Result<Option<Override>, OverrideError> {
        let value =
            serde_json::to_string(&new).map_err(|e| StoreError::Unavailable(e.to_string()))?;
        // Expiry is judged by the writer's clock, the one that set `set_at_ms`.
        let (max_text, now) = (max.to_string(), new.set_at_ms.to_string());
        let args = ["put", &new.field(), &value, &new.domain, &max_text, &now];
        let put: Put = text(&call(self, &args).await?)?;
        if put.full {
            return Err(DomainFull {
                domain: new.domain,
                max,
            }
            .into());
        }
        Ok(put.before)
    }

    /// [`crate::store::CounterStore::delete_override`] in Redis.
    pub async fn delete_override(
        &self,
        domain: &str,
        descriptor: &[OverrideEntry],
    ) -> Result<Option<Override>, StoreError> {
        let reply = call(self, &["delete", &field(domain, descriptor)]).await?;
        Ok(text::<Deleted>(&reply)?.before)
    }

    /// [`crate::store::CounterStore::overrides_version`] in Redis.
    pub async fn overrides_version(&self) -> Result<u64, StoreError> {
        match call(self, &["version"]).await?[..] {
            [version] => Ok(u64::try_from(version).unwrap_or(0)),
            ref other => Err(StoreError::Unavailable(format!(
                "overrides.lua answered {} values for the version",
                other.len()
            ))),
        }
    }

    /// [`crate::store::CounterStore::load_overrides`] in Redis.
    pub async fn load_overrides(&self) -> Result<OverrideSet, StoreError> {
        let loaded: Loaded = text(&call(self, &["load"]).await?)?;
        Ok(OverrideSet::new(loaded.version, loaded.all))
    }
}
