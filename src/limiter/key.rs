//! Counter identities: the one place where a descriptor becomes a key.
//!
//! The encoding is injective: every part is length-prefixed, so no choice of
//! domain, keys or values (separators, braces, newlines, any length) can make
//! two different descriptors share a counter.

use std::sync::Arc;

use super::Window;

/// The injective byte encoding of a domain and the entries of one descriptor.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Identity(Arc<[u8]>);

impl Identity {
    /// The encoded bytes.
    pub fn as_bytes(&self) -> &[u8] {
        &self.0
    }
}

/// Builds an [`Identity`] part by part.
#[derive(Debug)]
pub struct IdentityBuilder {
    buf: Vec<u8>,
}

impl IdentityBuilder {
    /// Starts an identity in `domain`.
    pub fn new(domain: &str) -> Self {
        let mut builder = Self {
            buf: Vec::with_capacity(64),
        };
        builder.part(b'd', domain);
        builder
    }

    /// Adds an entry whose request value is counted as itself.
    pub fn value(&mut self, key: &str, value: &str) -> &mut Self {
        self.part(b'k', key);
        self.part(b'v', value);
        self
    }

    /// Adds an entry counted by the rule's wildcard pattern instead of its value
    /// (`share_threshold`): every value matching the pattern shares a counter.
    pub fn pattern(&mut self, key: &str, pattern: &str) -> &mut Self {
        self.part(b'k', key);
        self.part(b'p', pattern);
        self
    }

    /// The finished identity.
    pub fn build(self) -> Identity {
        Identity(self.buf.into())
    }

    fn part(&mut self, tag: u8, text: &str) {
        self.buf.push(tag);
        self.buf
            .extend_from_slice(&(text.len() as u64).to_le_bytes());
        self.buf.extend_from_slice(text.as_bytes());
    }
}

/// One counter: an identity counted in one window.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct CounterKey {
    /// Who is counted.
    pub identity: Identity,
    /// How they are counted.
    pub window: Window,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(domain: &str, entries: &[(&str, &str)]) -> Identity {
        let mut b = IdentityBuilder::new(domain);
        for (k, v) in entries {
            b.value(k, v);
        }
        b.build()
    }

    #[test]
    fn separators_in_values_do_not_collide() {
        assert_ne!(id("d", &[("a_b", "c")]), id("d", &[("a", "b_c")]));
        assert_ne!(id("d_a", &[("b", "c")]), id("d", &[("a_b", "c")]));
        assert_ne!(
            id("d", &[("a", "b"), ("c", "d")]),
            id("d", &[("a", "bc"), ("", "d")])
        );
        assert_ne!(id("d", &[("a", "{x}")]), id("d", &[("a", "{x")]));
    }

    #[test]
    fn pattern_and_literal_value_are_different_identities() {
        let mut literal = IdentityBuilder::new("d");
        literal.value("path", "files/*");
        let mut shared = IdentityBuilder::new("d");
        shared.pattern("path", "files/*");
        assert_ne!(literal.build(), shared.build());
    }
}
