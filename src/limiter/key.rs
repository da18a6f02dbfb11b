//! Counter identities: the one place where a descriptor becomes a key.
//!
//! The encoding is injective: every part is tagged and length-prefixed, so no
//! choice of domain, keys or values (separators, braces, newlines, any
//! length) can make two different descriptors share a counter.
//!
//! In Redis an identity becomes one key, `<prefix>{<tag>}`. The tag spells a
//! short identity out, part by part (`{d5benchk4userv3bob}`: each part's
//! tag, its length as one character, its text with `%`, braces and control
//! characters escaped), still injective; a long one is `h` and its SHA-256
//! in unpadded base64url (bounded length). No `{` or `}` is left in the tag,
//! so no value can choose the cluster slot, and the whole key of one
//! identity hashes to one slot. The key is short on purpose: Redis hashes,
//! compares and copies it on every command of a decision, and its Lua
//! interns it byte by byte (see the benchmarks log).

use std::sync::Arc;

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
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
        let mut key = String::with_capacity(prefix.len() + INLINE_BYTES + 8);
        key.push_str(prefix);
        key.push('{');
        let tag = key.len();
        if self.0.len() > INLINE_BYTES || spell(&mut key, &self.0).is_none() {
            key.truncate(tag);
            key.push('h');
            URL_SAFE_NO_PAD.encode_string(Sha256::digest(&self.0), &mut key);
        }
        key.push('}');
        key
    }
}

/// Identities up to this many bytes are spelled out in their Redis key.
const INLINE_BYTES: usize = 64;

/// Appends the parts of `bytes` (an identity of at most [`INLINE_BYTES`])
/// to `out`, each as its tag, `'0'` plus its length (every part of such an
/// identity is shorter than 64 bytes: one character from `0` to `o`) and its
/// text, with `%`, `{`, `}` and control characters written `%XX` (their
/// byte in upper-case hex). Unescaping gives the parts back, so this is
/// injective, and it leaves no brace. `None` when `bytes` is not such an
/// identity (a part of 64 bytes or more), which the caller then hashes.
fn spell(out: &mut String, mut bytes: &[u8]) -> Option<()> {
    while let [tag, len, rest @ ..] = bytes {
        if !tag.is_ascii_alphabetic() || *len >= 64 {
            return None;
        }
        let (text, tail) = rest.split_at_checked(usize::from(*len))?;
        out.push(char::from(*tag));
        out.push(char::from(b'0' + len));
        let mut text = std::str::from_utf8(text).ok()?;
        while let Some(at) = text.bytes().position(escaped) {
            const DIGITS: &[u8; 16] = b"0123456789ABCDEF";
            let b = text.as_bytes()[at];
            out.push_str(&text[..at]);
            out.push('%');
            out.push(char::from(DIGITS[usize::from(b >> 4)]));
            out.push(char::from(DIGITS[usize::from(b & 0x0f)]));
            text = &text[at + 1..];
        }
        out.push_str(text);
        bytes = tail;
    }
    bytes.is_empty().then_some(())
}

/// The bytes [`spell`] writes as `%XX`: the escape itself, the braces of a
/// hash tag, and control characters (a key stays one printable line for
/// `redis-cli --scan`, logs and the scripts that read them).
fn escaped(b: u8) -> bool {
    matches!(b, b'%' | b'{' | b'}' | 0x7f) || b < 0x20
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
        assert_eq!(a.len(), "p:{h}".len() + 43);
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

    /// Keys are what counters are found by after an upgrade: each part's
    /// tag, `'0'` plus its length, its text with `%`, braces and control
    /// characters escaped; a long identity's SHA-256 in unpadded base64url
    /// (the vector below is Python's
    /// `base64.urlsafe_b64encode(hashlib.sha256(…).digest())`).
    #[test]
    fn keys_spell_the_identity_out() {
        let spelled = [
            (id("d", &[("k", "v")]), "p:{d1dk1kv1v}"),
            (
                id(
                    "example",
                    &[("remote_address", "192.0.2.7"), ("path", "/\u{ff}\u{0}")],
                ),
                "p:{d7examplek>remote_addressv9192.0.2.7k4pathv4/\u{ff}%00}",
            ),
            (id("d", &[("k", "}{%7B%")]), "p:{d1dk1kv6%7D%7B%257B%25}"),
            (id("d", &[("k", "a\nb\r\u{7f}")]), "p:{d1dk1kv5a%0Ab%0D%7F}"),
        ];
        for (identity, key) in spelled {
            assert_eq!(identity.storage_key("p:"), key);
        }
        let long = id("d", &[("k", &"x".repeat(100))]);
        assert_eq!(
            long.storage_key(""),
            "{h3odGmCi04xodkARuk7BQohCwWNjp_KlZOFm7HwVPyy8}"
        );
    }

    /// Distinct identities get distinct keys, escapes or not, on both sides
    /// of the inline bound.
    #[test]
    fn keys_of_distinct_identities_differ() {
        let values = [
            "", "{", "}", "%", "%7B", "%257B", "%7D{", "a{b}c", "1", "11", "\n", "%0A", "\0", "%00",
        ];
        let mut identities = Vec::new();
        for v in values {
            identities.push(id("d", &[("k", v)]));
            identities.push(id("d", &[("k", v), ("k", v)]));
            identities.push(id("d", &[(v, "k")]));
        }
        // 62, 63, 64 and 65 bytes: the last hashed.
        for n in 54..58 {
            identities.push(id("d", &[("k", &"x".repeat(n))]));
        }
        let mut pattern = IdentityBuilder::new("d");
        pattern.pattern("k", "{");
        identities.push(pattern.build());
        identities.sort();
        identities.dedup();
        let mut keys: Vec<String> = identities.iter().map(|i| i.storage_key("p:")).collect();
        assert!(keys.iter().all(|k| k.matches(['{', '}']).count() == 2));
        keys.sort();
        keys.dedup();
        assert_eq!(keys.len(), identities.len());
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
