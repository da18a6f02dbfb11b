//! Redis URLs: the accepted forms, their parsing into an [`Endpoint`], and
//! a wrapper that keeps the password out of `Debug` and `Display`.

use std::fmt;
use std::path::PathBuf;

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

/// Where a URL says Redis is, and how to log in to it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Endpoint {
    pub(super) servers: Servers,
    pub(super) username: Option<String>,
    pub(super) password: Option<String>,
    /// `SELECT`ed after login (a single server only).
    pub(super) database: i64,
    /// `rediss…` schemes.
    pub(super) tls: bool,
}

/// The Redis a URL names.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum Servers {
    /// One server (`redis://`, `rediss://`, `redis+unix://`).
    Single(Address),
    /// Seeds of a Redis Cluster: any of them tells the rest.
    Cluster(Vec<Address>),
    /// Sentinels and the name of the service whose primary they name.
    Sentinel {
        sentinels: Vec<Address>,
        service: String,
    },
}

/// One server's address.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum Address {
    Tcp { host: String, port: u16 },
    Unix(PathBuf),
}

impl Address {
    /// `host:port`, as Redis Cluster names its nodes.
    pub(super) fn parse(text: &str) -> Result<Address, String> {
        let (host, port) = text
            .rsplit_once(':')
            .map_or((text, "6379"), |(h, p)| (h, p));
        let port: u16 = port
            .parse()
            .map_err(|_| format!("invalid port in '{text}'"))?;
        let host = host.trim_start_matches('[').trim_end_matches(']');
        if host.is_empty() {
            return Err(format!("missing host in '{text}'"));
        }
        Ok(Address::Tcp {
            host: host.to_owned(),
            port,
        })
    }
}

impl fmt::Display for Address {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Address::Tcp { host, port } if host.contains(':') => write!(f, "[{host}]:{port}"),
            Address::Tcp { host, port } => write!(f, "{host}:{port}"),
            Address::Unix(path) => write!(f, "{}", path.display()),
        }
    }
}

/// Parses one of the accepted URL forms.
pub(super) fn parse_url(url: &RedisUrl) -> Result<Endpoint, String> {
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
    let mut endpoint = Endpoint {
        servers: Servers::Cluster(Vec::new()),
        username,
        password,
        database: 0,
        tls: scheme.starts_with("rediss"),
    };
    if scheme == "redis+unix" {
        if !rest.starts_with('/') {
            return Err(
                "redis+unix:// takes the socket's absolute path: redis+unix:///path".into(),
            );
        }
        endpoint.servers = Servers::Single(Address::Unix(rest.into()));
        return Ok(endpoint);
    }
    let (hosts, path) = match rest.split_once('/') {
        Some((hosts, path)) => (hosts, Some(path).filter(|p| !p.is_empty())),
        None => (rest, None),
    };
    let mut servers = hosts
        .split(',')
        .map(Address::parse)
        .collect::<Result<Vec<_>, String>>()?;
    endpoint.servers = match scheme {
        "redis" | "rediss" => {
            if let Some(db) = path {
                endpoint.database = db.parse().map_err(|_| format!("invalid database '{db}'"))?;
            }
            if servers.len() != 1 {
                return Err(format!(
                    "{scheme}:// takes one host; use redis-cluster:// or redis-sentinel:// for several"
                ));
            }
            Servers::Single(servers.remove(0))
        }
        "redis-cluster" | "rediss-cluster" => {
            if path.is_some() {
                return Err("redis-cluster:// takes no database".into());
            }
            Servers::Cluster(servers)
        }
        "redis-sentinel" | "rediss-sentinel" => {
            let service = path.ok_or(
                "redis-sentinel:// needs the service name: redis-sentinel://host:port/service",
            )?;
            Servers::Sentinel {
                sentinels: servers,
                service: service.to_owned(),
            }
        }
        other => {
            return Err(format!(
                "unsupported scheme '{other}' (use redis, rediss, redis+unix, redis-cluster or redis-sentinel)"
            ));
        }
    };
    Ok(endpoint)
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
    fn url_forms_map_to_endpoints() {
        let c = parse_url(&RedisUrl::new("redis://alice:p%40ss@127.0.0.1:7000/2")).unwrap();
        assert_eq!(
            (
                c.username.as_deref(),
                c.password.as_deref(),
                c.database,
                c.tls
            ),
            (Some("alice"), Some("p@ss"), 2, false)
        );
        assert_eq!(
            c.servers,
            Servers::Single(Address::Tcp {
                host: "127.0.0.1".into(),
                port: 7000
            })
        );
        let c = parse_url(&RedisUrl::new("redis-cluster://127.0.0.1:7000,[::1]:7001")).unwrap();
        assert!(matches!(c.servers, Servers::Cluster(ref hosts) if hosts.len() == 2));
        if let Servers::Cluster(hosts) = &c.servers {
            assert_eq!(hosts[1].to_string(), "[::1]:7001");
        }
        let c = parse_url(&RedisUrl::new(
            "redis-sentinel://10.0.0.1:26379,10.0.0.2:26379/mymaster",
        ))
        .unwrap();
        assert!(
            matches!(c.servers, Servers::Sentinel { ref service, ref sentinels } if service == "mymaster" && sentinels.len() == 2)
        );
        let c = parse_url(&RedisUrl::new("redis+unix://:pw@/run/redis.sock")).unwrap();
        assert_eq!(c.password.as_deref(), Some("pw"));
        assert_eq!(
            c.servers,
            Servers::Single(Address::Unix("/run/redis.sock".into()))
        );
        assert!(
            parse_url(&RedisUrl::new("rediss://redis:6380"))
                .unwrap()
                .tls
        );
        assert!(
            parse_url(&RedisUrl::new("rediss-cluster://redis:6380"))
                .unwrap()
                .tls
        );
        for bad in [
            "redis:/x",
            "http://h:1",
            "redis://h:notaport",
            "redis://a:1,b:2",
            "redis-sentinel://h:1",
            "redis://h:1/db",
            "redis+unix://relative.sock",
            "redis-cluster://:7000",
        ] {
            assert!(
                parse_url(&RedisUrl::new(bad)).is_err(),
                "{bad} should be rejected"
            );
        }
    }
}
