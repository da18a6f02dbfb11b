//! Request size bounds: what one request may ask, so no request can cost
//! unbounded work in Sluice or in the store.

use crate::limiter::MAX_HITS;
use crate::request::Request;

use super::DecideError;
use super::plan::weight;

/// Limits on the size of one request, so no request can cost unbounded work.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Bounds {
    /// Most descriptors in one request.
    pub max_descriptors: usize,
    /// Most entries in one descriptor.
    pub max_entries: usize,
    /// Longest domain, entry key or entry value, in bytes.
    pub max_entry_bytes: usize,
    /// Largest weight (`hits_addend`) of a request or descriptor. Weights
    /// above [`MAX_HITS`] are refused whatever this says, and so is a request
    /// whose descriptors' weights add up to more than it.
    pub max_hits_addend: u64,
}

impl Default for Bounds {
    fn default() -> Self {
        Self {
            max_descriptors: 64,
            max_entries: 32,
            max_entry_bytes: 16_384,
            max_hits_addend: 1_000_000_000,
        }
    }
}

impl Bounds {
    /// Rejects requests that are empty or larger than the bounds.
    pub fn check(&self, request: &Request) -> Result<(), DecideError> {
        let invalid = |m: String| Err(DecideError::InvalidArgument(m));
        if request.domain.is_empty() {
            return invalid("rate limit domain must not be empty".into());
        }
        if request.domain.len() > self.max_entry_bytes {
            return invalid(format!(
                "domain is {} bytes (at most {})",
                request.domain.len(),
                self.max_entry_bytes
            ));
        }
        if request.descriptors.is_empty() {
            return invalid("rate limit descriptor list must not be empty".into());
        }
        if request.descriptors.len() > self.max_descriptors {
            return invalid(format!(
                "too many descriptors: {} (at most {})",
                request.descriptors.len(),
                self.max_descriptors
            ));
        }
        let max_hits = self.max_hits_addend.min(MAX_HITS);
        if u64::from(request.hits_addend) > max_hits {
            return invalid(format!(
                "hits_addend {} is larger than the maximum {max_hits}",
                request.hits_addend
            ));
        }
        // The weights of all descriptors together: what one counter named by
        // each of them would take. Checked, never wrapped, and bounded so the
        // stores' arithmetic (doubles in Redis) stays exact.
        let mut total: u64 = 0;
        for (i, descriptor) in request.descriptors.iter().enumerate() {
            if descriptor.entries.len() > self.max_entries {
                return invalid(format!(
                    "descriptor {i} has {} entries (at most {})",
                    descriptor.entries.len(),
                    self.max_entries
                ));
            }
            for (j, entry) in descriptor.entries.iter().enumerate() {
                let longest = entry.key.len().max(entry.value.len());
                if longest > self.max_entry_bytes {
                    return invalid(format!(
                        "descriptor {i} entry {j}: key or value is {longest} bytes (at most {})",
                        self.max_entry_bytes
                    ));
                }
            }
            if let Some(hits) = descriptor.hits_addend.filter(|&h| h > max_hits) {
                return invalid(format!(
                    "descriptor {i}: hits_addend {hits} is larger than the maximum {max_hits}"
                ));
            }
            total = match total.checked_add(weight(request, descriptor)) {
                Some(total) if total <= MAX_HITS => total,
                _ => {
                    return invalid(format!(
                        "the descriptors' hits_addend add up to more than {MAX_HITS} (2^53 - 1)"
                    ));
                }
            };
        }
        Ok(())
    }
}
