//! Reading upstream's variables as upstream does: Go's `strconv.ParseBool`
//! and durations, ports, listen addresses and Redis URLs. Every read goes
//! through a [`Reader`], which names the variable in any error (and, in
//! tests, records what was read, so the tables can be held to what the
//! code reads).

use config::Map;

use super::UpstreamError;

/// Parses a Go duration (`10s`, `1m30s`, `24h`, `250ms`, `0`) into
/// milliseconds.
pub fn go_duration_ms(text: &str) -> Result<u64, String> {
    let text = text.trim();
    if text == "0" {
        return Ok(0);
    }
    if text.is_empty() {
        return Err("empty duration".into());
    }
    let mut total = 0f64;
    let mut rest = text;
    while !rest.is_empty() {
        let number_len = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .ok_or("a number needs a unit (ns, us, ms, s, m, h)")?;
        if number_len == 0 {
            return Err("expected a number".into());
        }
        let number: f64 = rest[..number_len]
            .parse()
            .map_err(|_| format!("bad number '{}'", &rest[..number_len]))?;
        rest = &rest[number_len..];
        let unit_len = rest
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(rest.len());
        let millis = match &rest[..unit_len] {
            "ns" => 1e-6,
            "us" | "µs" => 1e-3,
            "ms" => 1.0,
            "s" => 1e3,
            "m" => 60e3,
            "h" => 3_600e3,
            unit => return Err(format!("unknown unit '{unit}' (ns, us, ms, s, m, h)")),
        };
        total += number * millis;
        rest = &rest[unit_len..];
    }
    if total > u64::MAX as f64 {
        return Err("too long".into());
    }
    Ok(total.round() as u64)
}

/// Go's `strconv.ParseBool`.
pub fn parse_bool(text: &str) -> Result<bool, String> {
    match text {
        "1" | "t" | "T" | "true" | "TRUE" | "True" => Ok(true),
        "0" | "f" | "F" | "false" | "FALSE" | "False" => Ok(false),
        _ => Err("expected true or false".into()),
    }
}

/// Bytes of local cache per entry, to turn `LOCAL_CACHE_SIZE_IN_BYTES` (a
/// freecache size upstream) into Sluice's entry count: an entry is a
/// counter key of some tens of bytes plus its expiry.
pub const LOCAL_CACHE_BYTES_PER_ENTRY: u64 = 128;

pub struct Reader<'a> {
    pub(super) env: &'a Map<String, String>,
    /// Every variable looked at, set or not: what `layer` honours (tests
    /// hold it against upstream's full list and the unsupported table).
    #[cfg(test)]
    pub(super) read: std::cell::RefCell<std::collections::BTreeSet<String>>,
}

impl Reader<'_> {
    pub(super) fn raw(&self, var: &str) -> Option<&str> {
        #[cfg(test)]
        self.read.borrow_mut().insert(var.to_owned());
        self.env
            .get(var)
            .map(|v| v.trim())
            .filter(|v| !v.is_empty())
    }

    pub(super) fn err(&self, var: &str, why: impl Into<String>) -> UpstreamError {
        UpstreamError {
            var: var.into(),
            value: self.env.get(var).cloned().unwrap_or_default(),
            why: why.into(),
        }
    }

    pub(super) fn string<'s>(&'s self, var: &str, default: &'s str) -> &'s str {
        self.raw(var).unwrap_or(default)
    }

    /// Go's strconv.ParseBool.
    pub(super) fn bool(&self, var: &str, default: bool) -> Result<bool, UpstreamError> {
        match self.raw(var) {
            None => Ok(default),
            Some(v) => parse_bool(v).map_err(|why| self.err(var, why)),
        }
    }

    pub(super) fn port(&self, var: &str, default: u16) -> Result<u16, UpstreamError> {
        match self.raw(var) {
            None => Ok(default),
            Some(v) => v
                .parse()
                .map_err(|_| self.err(var, "expected a port number (0 to 65535)")),
        }
    }

    pub(super) fn u64(&self, var: &str) -> Result<Option<u64>, UpstreamError> {
        self.raw(var)
            .map(|v| {
                v.parse()
                    .map_err(|_| self.err(var, "expected a whole number"))
            })
            .transpose()
    }

    pub(super) fn f64(&self, var: &str) -> Result<Option<f64>, UpstreamError> {
        self.raw(var)
            .map(|v| {
                v.parse::<f64>()
                    .ok()
                    .filter(|f| f.is_finite())
                    .ok_or_else(|| self.err(var, "expected a number"))
            })
            .transpose()
    }

    /// `HOST` and `PORT` as a socket address; an empty host is every
    /// interface, as in Go.
    pub(super) fn addr(
        &self,
        host_var: &str,
        port_var: &str,
        default_port: u16,
    ) -> Result<String, UpstreamError> {
        let host = self.string(host_var, "0.0.0.0");
        let port = self.port(port_var, default_port)?;
        let host = if host.contains(':') && !host.starts_with('[') {
            format!("[{host}]")
        } else {
            host.to_string()
        };
        let addr = format!("{host}:{port}");
        if addr.parse::<std::net::SocketAddr>().is_err() {
            return Err(self.err(host_var, "expected an IP address to listen on"));
        }
        Ok(addr)
    }

    /// A Redis URL in Sluice's form from upstream's `<prefix>_SOCKET_TYPE`,
    /// `<prefix>_TYPE`, `<prefix>_URL` (and `REDIS_TLS`, `REDIS_AUTH`'s user).
    pub(super) fn redis_url(
        &self,
        prefix: &str,
        user: Option<&str>,
    ) -> Result<Option<String>, UpstreamError> {
        let vars = RedisVars {
            url: format!("{prefix}_URL"),
            socket: format!("{prefix}_SOCKET_TYPE"),
            kind: format!("{prefix}_TYPE"),
        };
        let Some(url) = self.raw(&vars.url) else {
            return Ok(None);
        };
        let auth = user.map(|u| format!("{u}:@")).unwrap_or_default();
        // Upstream's default socket type is unix, with a path for a URL; a
        // host:port URL only works over TCP, so an unset socket type goes
        // by the URL's form.
        let unix = match self
            .raw(&vars.socket)
            .map(str::to_ascii_lowercase)
            .as_deref()
        {
            None => url.starts_with('/'),
            Some("tcp") => false,
            Some("unix") => true,
            Some(_) => return Err(self.err(&vars.socket, "expected tcp or unix")),
        };
        if unix {
            return self.redis_unix_url(&vars, url, &auth).map(Some);
        }
        if url.starts_with('/') {
            return Err(self.err(&vars.socket, "a socket path needs the unix socket type"));
        }
        self.redis_tcp_url(&vars, url, &auth).map(Some)
    }

    /// `redis+unix://` for a socket path.
    fn redis_unix_url(
        &self,
        vars: &RedisVars,
        path: &str,
        auth: &str,
    ) -> Result<String, UpstreamError> {
        if !path.starts_with('/') {
            return Err(self.err(&vars.url, "a unix socket is reached by its absolute path"));
        }
        if !self
            .string(&vars.kind, "single")
            .eq_ignore_ascii_case("single")
        {
            return Err(self.err(&vars.kind, "a unix socket serves a single Redis"));
        }
        Ok(format!("redis+unix://{auth}{path}"))
    }

    /// A single Redis, a Cluster or Sentinels over TCP (TLS with
    /// `REDIS_TLS`), from upstream's comma-separated list.
    fn redis_tcp_url(
        &self,
        vars: &RedisVars,
        url: &str,
        auth: &str,
    ) -> Result<String, UpstreamError> {
        let s = if self.bool("REDIS_TLS", false)? {
            "s"
        } else {
            ""
        };
        let hosts: Vec<&str> = url.split(',').map(str::trim).collect();
        let check_hosts = |hosts: &[&str]| match hosts.iter().find(|h| {
            !h.rsplit_once(':')
                .is_some_and(|(host, port)| !host.is_empty() && port.parse::<u16>().is_ok())
        }) {
            Some(h) => Err(self.err(&vars.url, format!("'{h}' is not host:port"))),
            None => Ok(()),
        };
        match self
            .string(&vars.kind, "single")
            .to_ascii_lowercase()
            .as_str()
        {
            "single" => {
                if hosts.len() != 1 {
                    return Err(self.err(&vars.url, "REDIS_TYPE=single takes one host:port"));
                }
                check_hosts(&hosts)?;
                Ok(format!("redis{s}://{auth}{}", hosts[0]))
            }
            "cluster" => {
                check_hosts(&hosts)?;
                Ok(format!("redis{s}-cluster://{auth}{}", hosts.join(",")))
            }
            "sentinel" => {
                // Upstream: the master's name, then the sentinels.
                let [master, sentinels @ ..] = hosts.as_slice() else {
                    unreachable!("split yields at least one item")
                };
                if sentinels.is_empty() {
                    return Err(self.err(
                        &vars.url,
                        "REDIS_TYPE=sentinel takes the master's name then sentinels: name,host:port[,…]",
                    ));
                }
                check_hosts(sentinels)?;
                Ok(format!(
                    "redis{s}-sentinel://{auth}{}/{master}",
                    sentinels.join(",")
                ))
            }
            _ => Err(self.err(&vars.kind, "expected single, cluster or sentinel")),
        }
    }
}

/// The names of one Redis's variables (`REDIS_…` or `REDIS_PERSECOND_…`).
struct RedisVars {
    url: String,
    socket: String,
    kind: String,
}
