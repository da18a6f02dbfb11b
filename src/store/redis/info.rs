//! `INFO` of every primary behind a Redis URL, for `sluice bench`.

use std::time::Duration;

use super::cluster::parse_slots;
use super::dial::{DialError, Dialer, Place};
use super::tls::RedisTls;
use super::url::{Address, RedisUrl, Servers, parse_url};
use crate::store::StoreError;

/// `INFO commandstats` and `INFO cpu` of every primary that `url` names: the
/// one server, or each primary of a cluster. For `sluice bench`, which reads
/// what a run cost the Redis behind any RLS server.
pub async fn server_info(url: &RedisUrl) -> Result<Vec<String>, StoreError> {
    let unavailable = |e: String| StoreError::Unavailable(format!("Redis at {url}: {e}"));
    let endpoint = parse_url(url).map_err(|e| unavailable(format!("invalid URL: {e}")))?;
    let tls = match endpoint.tls {
        true => Some(RedisTls::default().client_config().map_err(unavailable)?),
        false => None,
    };
    let dialer = Dialer::new(&endpoint, tls, Duration::from_secs(5));
    let places = match endpoint.servers {
        Servers::Single(address) => vec![Place::At(address)],
        Servers::Sentinel { sentinels, service } => vec![Place::Primary { sentinels, service }],
        Servers::Cluster(seeds) => primaries(&dialer, &seeds).await.map_err(unavailable)?,
    };
    let mut texts = Vec::with_capacity(places.len());
    for place in places {
        let (mut conn, traffic) = dialer
            .connect(&place)
            .await
            .map_err(|e| unavailable(why(e)))?;
        // One section per INFO: Redis before 7.0 takes only one.
        let mut text = String::new();
        for section in ["commandstats", "cpu"] {
            let part: String = redis::cmd("INFO")
                .arg(section)
                .query_async(&mut conn)
                .await
                .map_err(|e| unavailable(e.to_string()))?;
            text.push_str(&part);
            text.push_str("\r\n");
        }
        traffic.abort();
        texts.push(text);
    }
    Ok(texts)
}

/// The primaries of a cluster, from the first seed that answers
/// `CLUSTER SLOTS`.
async fn primaries(dialer: &Dialer, seeds: &[Address]) -> Result<Vec<Place>, String> {
    let mut last = String::from("no seed given");
    for seed in seeds {
        let (mut conn, traffic) = match dialer.connect(&Place::At(seed.clone())).await {
            Ok(connection) => connection,
            Err(e) => {
                last = why(e);
                continue;
            }
        };
        let reply = redis::cmd("CLUSTER")
            .arg("SLOTS")
            .query_async(&mut conn)
            .await;
        traffic.abort();
        let host = match seed {
            Address::Tcp { host, .. } => host.as_str(),
            Address::Unix(_) => "",
        };
        match reply.map(|r| parse_slots(r, host)) {
            Ok(Some(ranges)) => {
                let mut places: Vec<Place> = Vec::new();
                for (_, _, address) in ranges {
                    let at = Address::parse(&address)?;
                    if !places.iter().any(|p| matches!(p, Place::At(a) if *a == at)) {
                        places.push(Place::At(at));
                    }
                }
                return Ok(places);
            }
            Ok(None) => last = format!("{seed}: unexpected CLUSTER SLOTS reply"),
            Err(e) => last = format!("{seed}: {e}"),
        }
    }
    Err(last)
}

fn why(e: DialError) -> String {
    match e {
        DialError::Refused(why) | DialError::Failed(why) => why,
    }
}
