//! Redis URLs: the accepted forms, their parsing into a fred config, and a
//! wrapper that keeps the password out of `Debug` and `Display`.

use std::fmt;

use fred::prelude::{Config, Server, ServerConfig, TlsConnector};
use fred::types::config::ClusterDiscoveryPolicy;
use serde::{Deserialize, Serialize};

/// A Redis URL whose password never appears in `Debug` or `Display`.
#[derive(Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(transparent)]
pub struct RedisUrl(String);

impl RedisUrl {
    /// Wraps a URL.
    pub fn new(url: impl Into<String>) -> Self {
        Self(url.into())
    }

    /// The URL with its password (for connecting only).
    pub fn expose(&self) -> &str {
        &self.0
    }

    /// The URL with `password` as its password (percent-encoded). A user
    /// name in the URL (`user:…@`) is kept; a password in it is replaced,
    /// including the `password@` form, which names no user. Lets a password
    /// kept in a Kubernetes Secret stay out of the URL.
    pub fn with_password(&self, password: &str) -> RedisUrl {
        let Some((scheme, rest)) = self.0.split_once("://") else {
            return self.clone();
        };
        let (user, hosts) = match rest.rsplit_once('@') {
            Some((auth, hosts)) => (auth.split_once(':').map_or("", |(u, _)| u), hosts),
            None => ("", rest),
        };
        RedisUrl(format!(
            "{scheme}://{user}:{}@{hosts}",
            percent_encode(password)
        ))
    }
}

/// Every byte but the URL's unreserved characters as `%XX`.
fn percent_encode(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for byte in text.bytes() {
        if byte.is_ascii_alphanumeric() || b"-._~".contains(&byte) {
            out.push(byte as char);
        } else {
            out.push_str(&format!("%{byte:02X}"));
        }
    }
    out
}

impl fmt::Display for RedisUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0.split_once("://") {
            Some((scheme, rest)) => match rest.rsplit_once('@') {
                Some((auth, host)) => {
                    let user = auth.split_once(':').map_or("", |(u, _)| u);
                    write!(f, "{scheme}://{user}:***@{host}")
                }
                None => f.write_str(&self.0),
            },
            None => f.write_str(&self.0),
        }
    }
}

impl fmt::Debug for RedisUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "\"{self}\"")
    }
}

/// Parses one of the accepted URL forms into a fred config.
pub(super) fn parse_url(url: &RedisUrl) -> Result<Config, String> {
    let text = url.expose();
    let (scheme, rest) = text.split_once("://").ok_or("missing '://'")?;
    let (auth, rest) = match rest.rsplit_once('@') {
        Some((auth, rest)) => (Some(auth), rest),
        None => (None, rest),
    };
    let (username, password) = match auth {
        None => (None, None),
        Some(auth) => match auth.split_once(':') {
            Some((user, pass)) => (
                Some(percent_decode(user)?).filter(|u| !u.is_empty()),
                Some(percent_decode(pass)?),
            ),
            None => (None, Some(percent_decode(auth)?)),
        },
    };
    if scheme == "redis+unix" {
        if !rest.starts_with('/') {
            return Err(
                "redis+unix:// takes the socket's absolute path: redis+unix:///path".into(),
            );
        }
        return Ok(Config {
            username,
            password,
            server: ServerConfig::Unix { path: rest.into() },
            ..Config::default()
        });
    }
    let (hosts, path) = match rest.split_once('/') {
        Some((hosts, path)) => (hosts, Some(path).filter(|p| !p.is_empty())),
        None => (rest, None),
    };
    let servers = hosts
        .split(',')
        .map(|h| {
            let (host, port) = h.rsplit_once(':').map_or((h, "6379"), |(h, p)| (h, p));
            let port: u16 = port.parse().map_err(|_| format!("invalid port in '{h}'"))?;
            if host.is_empty() {
                return Err(format!("missing host in '{h}'"));
            }
            Ok(Server::new(
                host.trim_start_matches('[').trim_end_matches(']'),
                port,
            ))
        })
        .collect::<Result<Vec<_>, String>>()?;
    let mut config = Config {
        username,
        password,
        ..Config::default()
    };
    let single = || match servers.as_slice() {
        [one] => Ok(one.clone()),
        _ => Err(format!(
            "{scheme}:// takes one host; use redis-cluster:// or redis-sentinel:// for several"
        )),
    };
    config.server = match scheme {
        "redis" | "rediss" => {
            if let Some(db) = path {
                config.database = Some(db.parse().map_err(|_| format!("invalid database '{db}'"))?);
            }
            ServerConfig::Centralized { server: single()? }
        }
        "redis-cluster" | "rediss-cluster" => {
            if path.is_some() {
                return Err("redis-cluster:// takes no database".into());
            }
            ServerConfig::Clustered {
                hosts: servers,
                policy: ClusterDiscoveryPolicy::default(),
            }
        }
        "redis-sentinel" | "rediss-sentinel" => {
            let service_name = path.ok_or(
                "redis-sentinel:// needs the service name: redis-sentinel://host:port/service",
            )?;
            ServerConfig::Sentinel {
                hosts: servers,
                service_name: service_name.to_owned(),
                username: config.username.clone(),
                password: config.password.clone(),
            }
        }
        other => {
            return Err(format!(
                "unsupported scheme '{other}' (use redis, rediss, redis+unix, redis-cluster or redis-sentinel)"
            ));
        }
    };
    if scheme.starts_with("rediss") {
        let connector = TlsConnector::default_rustls().map_err(|e| format!("TLS set-up: {e}"))?;
        config.tls = Some(connector.into());
    }
    Ok(config)
}

fn percent_decode(text: &str) -> Result<String, String> {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = text
                .get(i + 1..i + 3)
                .ok_or("truncated %-escape in the URL")?;
            out.push(u8::from_str_radix(hex, 16).map_err(|_| "invalid %-escape in the URL")?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).map_err(|_| "the URL's credentials are not UTF-8".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwords_never_show_in_debug_or_display() {
        let url = RedisUrl::new("redis://alice:s3cret@redis:6379/0");
        assert_eq!(url.to_string(), "redis://alice:***@redis:6379/0");
        assert!(!format!("{url:?}").contains("s3cret"));
        assert_eq!(
            RedisUrl::new("redis://redis:6379").to_string(),
            "redis://redis:6379"
        );
    }

    #[test]
    fn a_separate_password_is_encoded_into_the_url() {
        let password = "p@ss:w/rd %ü";
        for (url, user) in [
            ("redis://redis:6379/1", None),
            ("redis://alice:@redis:6379", Some("alice")),
            ("redis://stale@redis:6379", None),
            ("redis://alice:old@redis:6379", Some("alice")),
            ("redis://:old@redis:6379", None),
            ("redis-cluster://a:7000,b:7001", None),
            ("rediss-sentinel://s1:26379,s2:26379/mymaster", None),
        ] {
            let merged = RedisUrl::new(url).with_password(password);
            let c = parse_url(&merged).unwrap_or_else(|e| panic!("{url}: {e}"));
            assert_eq!(
                (c.username.as_deref(), c.password.as_deref()),
                (user, Some(password)),
                "{url} -> {}",
                merged.expose()
            );
            assert!(!merged.to_string().contains("p@ss"), "{merged}");
        }
        let merged = RedisUrl::new("redis://redis:6379/1").with_password("x");
        assert_eq!(merged.expose(), "redis://:x@redis:6379/1");
    }

    #[test]
    fn url_forms_map_to_fred_configs() {
        let c = parse_url(&RedisUrl::new("redis://alice:p%40ss@127.0.0.1:7000/2")).unwrap();
        assert_eq!(
            (c.username.as_deref(), c.password.as_deref(), c.database),
            (Some("alice"), Some("p@ss"), Some(2))
        );
        assert!(matches!(c.server, ServerConfig::Centralized { .. }));
        let c = parse_url(&RedisUrl::new(
            "redis-cluster://127.0.0.1:7000,127.0.0.1:7001",
        ))
        .unwrap();
        assert!(matches!(c.server, ServerConfig::Clustered { ref hosts, .. } if hosts.len() == 2));
        let c = parse_url(&RedisUrl::new(
            "redis-sentinel://10.0.0.1:26379,10.0.0.2:26379/mymaster",
        ))
        .unwrap();
        assert!(
            matches!(c.server, ServerConfig::Sentinel { ref service_name, .. } if service_name == "mymaster")
        );
        let c = parse_url(&RedisUrl::new("redis+unix://:pw@/run/redis.sock")).unwrap();
        assert_eq!(c.password.as_deref(), Some("pw"));
        assert!(
            matches!(c.server, ServerConfig::Unix { ref path } if path.as_os_str() == "/run/redis.sock")
        );
        assert!(
            parse_url(&RedisUrl::new("rediss://redis:6380"))
                .unwrap()
                .tls
                .is_some()
        );
        for bad in [
            "redis:/x",
            "http://h:1",
            "redis://h:notaport",
            "redis://a:1,b:2",
            "redis-sentinel://h:1",
            "redis://h:1/db",
            "redis+unix://relative.sock",
        ] {
            assert!(
                parse_url(&RedisUrl::new(bad)).is_err(),
                "{bad} should be rejected"
            );
        }
    }
}
