//! A rate-limit request in the crate's own terms, independent of protobuf:
//! `service.rs` converts the wire message into these, moving the strings.

use crate::limiter::Unit;

/// One `ShouldRateLimit` call.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Request {
    /// Namespace of the rules to apply.
    pub domain: String,
    /// What to limit; one status is returned per descriptor, in order.
    pub descriptors: Vec<Descriptor>,
    /// Request-level weight; 0 means 1.
    pub hits_addend: u32,
}

/// An ordered list of entries identifying what is counted.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Descriptor {
    /// The entries, matched level by level against the rules tree.
    pub entries: Vec<Entry>,
    /// A limit supplied by the caller instead of the configured one.
    pub limit: Option<Override>,
    /// Weight of this descriptor; when set (even to 0) it wins over the
    /// request's. 0 checks without counting.
    pub hits_addend: Option<u64>,
    /// Envoy's `is_negative_hits`: the weight is given back to the limits
    /// (a refund, never below empty) instead of counted.
    pub is_negative_hits: bool,
}

/// One key/value pair of a descriptor.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Entry {
    /// The entry key, e.g. `remote_address`.
    pub key: String,
    /// The entry value, e.g. `192.0.2.7`.
    pub value: String,
}

impl Entry {
    /// An entry from anything string-like.
    pub fn new(key: impl Into<String>, value: impl Into<String>) -> Self {
        Self {
            key: key.into(),
            value: value.into(),
        }
    }
}

/// A request-supplied limit (`RateLimitDescriptor.limit`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Override {
    /// Requests allowed per unit.
    pub requests_per_unit: u32,
    /// The window.
    pub unit: Unit,
}

impl Descriptor {
    /// A descriptor from `(key, value)` pairs.
    pub fn of<K: Into<String>, V: Into<String>>(entries: impl IntoIterator<Item = (K, V)>) -> Self {
        Self {
            entries: entries.into_iter().map(|(k, v)| Entry::new(k, v)).collect(),
            ..Self::default()
        }
    }
}

/// One descriptor given as text, `k=v[,k=v…]`: `sluice query --descriptor`,
/// the admin `/counters` query, `sluice bench` workloads.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DescriptorArg(pub Vec<(String, String)>);

impl std::str::FromStr for DescriptorArg {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        text.split(',')
            .map(|pair| {
                let (key, value) = pair
                    .split_once('=')
                    .ok_or_else(|| format!("'{pair}' is not key=value"))?;
                if key.is_empty() {
                    return Err(format!("'{pair}' has an empty key"));
                }
                Ok((key.to_owned(), value.to_owned()))
            })
            .collect::<Result<_, _>>()
            .map(DescriptorArg)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn descriptor_args_parse_pairs() {
        let d: DescriptorArg = "a=1,b=x=y".parse().unwrap();
        assert_eq!(
            d.0,
            vec![("a".into(), "1".into()), ("b".into(), "x=y".into())]
        );
        assert!("novalue".parse::<DescriptorArg>().is_err());
        assert!("=v".parse::<DescriptorArg>().is_err());
    }
}
