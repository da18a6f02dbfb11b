//! A rule's stats key, `domain.key_value.key…`, as envoyproxy/ratelimit
//! names it: a fact of the rules (each rule carries its key), which
//! upstream's stats (`telemetry::upstream`) count under.

/// Upstream's stat-name sanitizer: statsd separators become `_`.
pub fn sanitize(part: &str) -> String {
    part.replace([':', '|'], "_")
}

/// A rule's stats key as upstream builds it from the *config*:
/// `domain.k1_v1.k2…`, each level `key` or `key_value` when the rule names
/// a value there.
pub fn stats_key<'a>(
    domain: &str,
    levels: impl IntoIterator<Item = (&'a str, Option<&'a str>)>,
) -> String {
    let mut out = sanitize(domain);
    for (key, value) in levels {
        out.push('.');
        out.push_str(&sanitize(key));
        if let Some(value) = value.filter(|v| !v.is_empty()) {
            out.push('_');
            out.push_str(&sanitize(value));
        }
    }
    out
}

/// The key of a `detailed_metric` rule: every level carries its runtime
/// value (upstream builds it from the request's descriptor).
pub fn detailed_stats_key<'a>(
    domain: &str,
    entries: impl IntoIterator<Item = (&'a str, &'a str)>,
) -> String {
    stats_key(domain, entries.into_iter().map(|(k, v)| (k, Some(v))))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stats_key_uses_config_values_and_bare_keys() {
        assert_eq!(
            stats_key("edge", [("remote_address", None), ("path", Some("/api"))]),
            "edge.remote_address.path_/api"
        );
        assert_eq!(stats_key("d", [("k", Some(""))]), "d.k");
    }

    #[test]
    fn stats_key_escapes_statsd_separators() {
        assert_eq!(stats_key("a:b", [("k|x", Some("v:1"))]), "a_b.k_x_v_1");
    }

    #[test]
    fn detailed_key_carries_runtime_values() {
        assert_eq!(
            detailed_stats_key("d", [("k1", "v1"), ("k2", "10.0.0.1:80")]),
            "d.k1_v1.k2_10.0.0.1_80"
        );
    }
}
