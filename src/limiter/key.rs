//! Counter identities: the one place where a descriptor becomes a key.
//!
//! The encoding is injective: every part is tagged and length-prefixed, so no
//! choice of domain, keys or values (separators, braces, newlines, any
//! length) can make two different descriptors share a counter.
//!
//! In Redis an identity becomes one key, `<prefix>{<tag>}`: the tag is the
//! identity in hex when it is short (still injective) or `h` and the hex of
//! its SHA-256 when it is long (bounded length). Hex has no `{` or `}`, so no
//! value can choose the cluster slot, and the whole key of one identity hashes
//! to one slot.

use std::sync::Arc;

use sha2::{Digest, Sha256};

use super::Window;

/// The injective byte encoding of a domain and the entries of one descriptor.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Identity(Arc<[u8]>);

impl Identity {
    /// The encoded bytes.
    pub fn as_bytes(&self) -> &[u8] {
        &self.0
    }

    /// The Redis key of this identity's HASH.
    pub fn storage_key(&self, prefix: &str) -> String {
        let mut key = Vec::with_capacity(prefix.len() + 2 + 2 * INLINE_BYTES.max(32) + 1);
        key.extend_from_slice(prefix.as_bytes());
        key.push(b'{');
        if self.0.len() <= INLINE_BYTES {
            hex(&mut key, &self.0);
        } else {
            key.push(b'h');
            hex(&mut key, &Sha256::digest(&self.0));
        }
        key.push(b'}');
        // The prefix is a `str` and the rest ASCII: always UTF-8.
        String::from_utf8(key)
            .unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned())
    }
}

/// Identities up to this many bytes are spelled out in their Redis key.
const INLINE_BYTES: usize = 64;

/// Lower-case hex of `bytes`, appended to `out`. By table into bytes sized
/// once (checked as UTF-8 once, by the caller), not `write!` nor a `push`
/// per digit: this runs for every key of every Redis decision, and the
/// formatting machinery cost tens of nanoseconds per byte, a `char` pushed
/// about seventeen instructions.
fn hex(out: &mut Vec<u8>, bytes: &[u8]) {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let start = out.len();
    out.resize(start + 2 * bytes.len(), 0);
    for (pair, &b) in out[start..].chunks_exact_mut(2).zip(bytes) {
        pair[0] = DIGITS[usize::from(b >> 4)];
        pair[1] = DIGITS[usize::from(b & 0x0f)];
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

    /// A tag byte, the length as a LEB128 varint (prefix-free, one byte
    /// for short texts), then the text.
    fn part(&mut self, tag: u8, text: &str) {
        self.buf.push(tag);
        let mut len = text.len();
        loop {
            let byte = (len & 0x7f) as u8;
            len >>= 7;
            if len == 0 {
                self.buf.push(byte);
                break;
            }
            self.buf.push(byte | 0x80);
        }
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
    fn long_values_get_a_bounded_key_and_short_ones_stay_distinct() {
        let long = id("d", &[("k", &"x".repeat(10_000))]);
        let longer = id("d", &[("k", &"x".repeat(10_001))]);
        let (a, b) = (long.storage_key("p:"), longer.storage_key("p:"));
        assert_eq!(a.len(), "p:{h}".len() + 64);
        assert_ne!(a, b);
        let short = id("d", &[("k", "v")]).storage_key("p:");
        assert!(short.starts_with("p:{") && short.ends_with('}'));
        assert_eq!(
            short.matches('{').count(),
            1,
            "values can never add a hash tag"
        );
        let braces = id("d", &[("k", "}{x}{")]).storage_key("");
        assert_eq!(
            (braces.matches('{').count(), braces.matches('}').count()),
            (1, 1)
        );
    }

    /// Keys are what counters are found by after an upgrade: the hex is
    /// plain lower-case `%02x` of the identity's bytes (or of its SHA-256).
    #[test]
    fn keys_spell_the_identity_in_lower_case_hex() {
        let reference =
            |bytes: &[u8]| -> String { bytes.iter().map(|b| format!("{b:02x}")).collect() };
        for identity in [
            id("d", &[("k", "v")]),
            id(
                "example",
                &[("remote_address", "192.0.2.7"), ("path", "/\u{ff}\u{0}")],
            ),
        ] {
            assert_eq!(
                identity.storage_key("p:"),
                format!("p:{{{}}}", reference(&identity.0))
            );
        }
        let long = id("d", &[("k", &"x".repeat(100))]);
        assert_eq!(
            long.storage_key(""),
            format!("{{h{}}}", reference(&Sha256::digest(&long.0)))
        );
    }

    #[test]
    fn lengths_of_any_size_stay_injective() {
        // 127 and 128 bytes straddle the one-byte varint boundary.
        let a = id("d", &[(&"k".repeat(127), "v")]);
        let b = id("d", &[(&"k".repeat(128), "")]);
        assert_ne!(a, b);
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
