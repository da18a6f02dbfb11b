//! What `sluice bench` sends: descriptor templates filled with a key drawn
//! from a uniform or Zipf distribution over a fixed number of keys.

use rand::Rng;
use rand_distr::{Distribution as _, Uniform, Zipf};

use crate::proto as pb;
use crate::proto::rate_limit_descriptor::Entry;
use crate::request::DescriptorArg;

/// The placeholder a template value replaces with the request's key.
pub const KEY: &str = "{key}";

/// How keys are drawn.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Distribution {
    /// Every key equally likely.
    Uniform,
    /// Key `k` (1-based) with probability proportional to `1 / k^s`: a few hot
    /// keys and a long tail, as real client populations are.
    Zipf,
}

/// One descriptor as `k=v[,k=v…]`, where `{key}` in a value is replaced by
/// the request's key.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DescriptorTemplate {
    /// Keys and values split around the placeholder.
    entries: Vec<(String, Vec<String>)>,
}

impl std::str::FromStr for DescriptorTemplate {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let DescriptorArg(pairs) = text.parse()?;
        Ok(Self {
            entries: pairs
                .into_iter()
                .map(|(k, v)| (k, v.split(KEY).map(str::to_owned).collect()))
                .collect(),
        })
    }
}

impl DescriptorTemplate {
    fn fill(&self, key: &str) -> pb::RateLimitDescriptor {
        pb::RateLimitDescriptor {
            entries: self
                .entries
                .iter()
                .map(|(k, parts)| Entry {
                    key: k.clone(),
                    value: parts.join(key),
                })
                .collect(),
            ..Default::default()
        }
    }
}

/// Draws keys `0..count`.
#[derive(Clone, Debug)]
pub enum Keys {
    /// Uniformly.
    Uniform(Uniform<u64>),
    /// By a Zipf law (key 0 the most frequent).
    Zipf(Zipf<f64>),
}

impl Keys {
    /// Keys `0..count` drawn by `distribution`; `exponent` is Zipf's `s`.
    pub fn new(count: u64, distribution: Distribution, exponent: f64) -> Result<Self, String> {
        if count == 0 {
            return Err("--keys must be at least 1".into());
        }
        match distribution {
            Distribution::Uniform => Uniform::new(0, count)
                .map(Keys::Uniform)
                .map_err(|e| e.to_string()),
            Distribution::Zipf => Zipf::new(count as f64, exponent)
                .map(Keys::Zipf)
                .map_err(|e| format!("invalid Zipf exponent {exponent}: {e}")),
        }
    }

    /// One key.
    pub fn sample(&self, rng: &mut impl Rng) -> u64 {
        match self {
            Keys::Uniform(u) => u.sample(rng),
            // Zipf draws 1..=count as a float.
            Keys::Zipf(z) => z.sample(rng) as u64 - 1,
        }
    }
}

/// The request mix of one run.
#[derive(Clone, Debug)]
pub struct Workload {
    /// The domain of every request.
    pub domain: String,
    /// The descriptors of every request, filled with one key per request.
    pub templates: Vec<DescriptorTemplate>,
    /// `hits_addend` (0: the server's default of 1).
    pub hits: u32,
}

impl Workload {
    /// The request for `key`.
    pub fn request(&self, key: u64) -> pb::RateLimitRequest {
        let key = key.to_string();
        pb::RateLimitRequest {
            domain: self.domain.clone(),
            descriptors: self.templates.iter().map(|t| t.fill(&key)).collect(),
            hits_addend: self.hits,
        }
    }
}

#[cfg(test)]
mod tests {
    use rand::SeedableRng;
    use rand::rngs::SmallRng;

    use super::*;

    #[test]
    fn templates_put_the_key_wherever_the_placeholder_is() {
        let workload = Workload {
            domain: "d".into(),
            templates: vec![
                "user={key}".parse().unwrap(),
                "path=/api,client=c-{key}-x{key}".parse().unwrap(),
            ],
            hits: 3,
        };
        let request = workload.request(42);
        assert_eq!(request.domain, "d");
        assert_eq!(request.hits_addend, 3);
        let pairs: Vec<Vec<(&str, &str)>> = request
            .descriptors
            .iter()
            .map(|d| {
                d.entries
                    .iter()
                    .map(|e| (e.key.as_str(), e.value.as_str()))
                    .collect()
            })
            .collect();
        assert_eq!(
            pairs,
            vec![
                vec![("user", "42")],
                vec![("path", "/api"), ("client", "c-42-x42")]
            ]
        );
    }

    #[test]
    fn keys_stay_in_range_and_zipf_favours_the_first() {
        let mut rng = SmallRng::seed_from_u64(7);
        let uniform = Keys::new(10, Distribution::Uniform, 1.0).unwrap();
        let zipf = Keys::new(10, Distribution::Zipf, 1.2).unwrap();
        let mut counts = [[0u32; 10]; 2];
        for _ in 0..20_000 {
            counts[0][uniform.sample(&mut rng) as usize] += 1;
            counts[1][zipf.sample(&mut rng) as usize] += 1;
        }
        // Uniform: every key near 2,000; Zipf: key 0 far ahead of key 9.
        assert!(
            counts[0].iter().all(|&c| (1_700..2_300).contains(&c)),
            "{counts:?}"
        );
        assert!(counts[1][0] > 5 * counts[1][9], "{counts:?}");
        assert!(Keys::new(0, Distribution::Uniform, 1.0).is_err());
        assert!(Keys::new(5, Distribution::Zipf, -1.0).is_err());
    }
}
