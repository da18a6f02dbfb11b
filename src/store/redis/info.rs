//! `INFO` of every primary behind a Redis URL, for `sluice bench`.

use std::time::Duration;

use fred::interfaces::{ClientLike, ClusterInterface};
use fred::prelude::{Builder, Server, ServerConfig};
use fred::types::{ClusterHash, CustomCommand, Value};

use super::url::{RedisUrl, parse_url};
use crate::store::StoreError;

/// `INFO commandstats` and `INFO cpu` of every primary that `url` names: the
/// one server, or each primary of a cluster. For `sluice bench`, which reads
/// what a run cost the Redis behind any RLS server.
pub async fn server_info(url: &RedisUrl) -> Result<Vec<String>, StoreError> {
    let config = parse_url(url)
        .map_err(|e| StoreError::Unavailable(format!("invalid Redis URL {url}: {e}")))?;
    let cluster = matches!(config.server, ServerConfig::Clustered { .. });
    let client = Builder::from_config(config)
        .with_connection_config(|c| c.connection_timeout = Duration::from_secs(5))
        .build()
        .map_err(|e| StoreError::Unavailable(e.to_string()))?;
    client
        .init()
        .await
        .map_err(|e| StoreError::Unavailable(e.to_string()))?;
    // `None`: the one server the client is connected to.
    let servers: Vec<Option<Server>> = if cluster {
        client
            .cached_cluster_state()
            .map(|state| state.unique_primary_nodes())
            .unwrap_or_default()
            .into_iter()
            .map(Some)
            .collect()
    } else {
        vec![None]
    };
    let mut texts = Vec::with_capacity(servers.len());
    for server in servers {
        // One section per INFO: Redis before 7.0 takes only one.
        let mut text = String::new();
        for section in ["commandstats", "cpu"] {
            let command = CustomCommand::new_static("INFO", ClusterHash::Random, false);
            let args = vec![Value::from(section)];
            let part: String = match &server {
                Some(server) => {
                    client
                        .with_cluster_node(server.clone())
                        .custom(command, args)
                        .await
                }
                None => client.custom(command, args).await,
            }
            .map_err(|e| StoreError::Unavailable(e.to_string()))?;
            text.push_str(&part);
            text.push_str("\r\n");
        }
        texts.push(text);
    }
    let _ = client.quit().await;
    Ok(texts)
}
