//! `*` wildcards in descriptor values: each `*` matches any run of characters
//! (including none), anywhere in the pattern, as envoyproxy/ratelimit does.

/// A compiled value pattern.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Pattern {
    text: String,
}

impl Pattern {
    /// Whether `value` is a pattern (contains `*`).
    pub fn is_pattern(value: &str) -> bool {
        value.contains('*')
    }

    /// A pattern for `text`.
    pub fn new(text: &str) -> Self {
        Self {
            text: text.to_owned(),
        }
    }

    /// The pattern as written.
    pub fn as_str(&self) -> &str {
        &self.text
    }

    /// Whether `value` matches. Greedy with one backtrack point, so the cost is
    /// at most `len(pattern) × len(value)` and usually linear.
    pub fn matches(&self, value: &str) -> bool {
        let (p, v) = (self.text.as_bytes(), value.as_bytes());
        let (mut pi, mut vi) = (0, 0);
        let mut star: Option<(usize, usize)> = None;
        while vi < v.len() {
            if pi < p.len() && p[pi] == b'*' {
                star = Some((pi, vi));
                pi += 1;
            } else if pi < p.len() && p[pi] == v[vi] {
                pi += 1;
                vi += 1;
            } else if let Some((sp, sv)) = star {
                pi = sp + 1;
                vi = sv + 1;
                star = Some((sp, sv + 1));
            } else {
                return false;
            }
        }
        p[pi..].iter().all(|&c| c == b'*')
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn m(p: &str, v: &str) -> bool {
        Pattern::new(p).matches(v)
    }

    #[test]
    fn star_matches_anything_anywhere() {
        assert!(m("foo*", "foo"));
        assert!(m("foo*", "foobar"));
        assert!(!m("foo*", "fo"));
        assert!(m("*bar", "foobar"));
        assert!(m("/api/*/users/*", "/api/v1/users/42"));
        assert!(!m("/api/*/users/*", "/api/v1/groups/42"));
        assert!(m("a*b*c", "aXXbYYc"));
        assert!(!m("a*b*c", "aXXcYYb"));
        assert!(m("*", ""));
        assert!(m("**", "x"));
    }

    #[test]
    fn matching_is_byte_exact_for_unicode() {
        assert!(m("é*", "école") == "école".starts_with('é'));
        assert!(m("*ü", "grüß-ü"));
    }
}
