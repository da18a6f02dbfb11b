//! The settings reference of the docs book (`docs/src/settings.md`),
//! rendered from the declaration — every setting of `settings!` with its
//! type, default, flag, `SLUICE_…` variable, settings-file key, upstream
//! variable and doc line — and from the table of upstream variables Sluice
//! does not honour. Never written by hand: a test renders it again and
//! fails when the committed page differs.

use std::fmt::Write as _;

use super::unsupported::UNSUPPORTED;
use super::{DECLARED, Declared, accepted_values, upstream};

/// Where the page lives, from the repository's root.
pub const PATH: &str = "docs/src/settings.md";

/// The setting's type as a reader would say it.
pub fn type_text(d: &Declared) -> String {
    let accepted = accepted_values(d.name);
    let ty = d.ty.replace(' ', "");
    let inner = ty
        .strip_prefix("Option<")
        .and_then(|t| t.strip_suffix('>'))
        .unwrap_or(&ty);
    let base = inner.rsplit("::").next().unwrap_or(inner);
    let unit = match d.value {
        "MS" => Some("milliseconds"),
        "BYTES" => Some("bytes"),
        _ => None,
    };
    let text = match base {
        "bool" => "boolean (`true` or `false`)".to_owned(),
        "u32" | "u64" | "usize" => match unit {
            Some(unit) => format!("whole number of {unit}"),
            None => "whole number".to_owned(),
        },
        "NonZeroU32" | "NonZeroU64" | "NonZeroUsize" => match unit {
            Some(unit) => format!("whole number of {unit}, at least 1"),
            None => "whole number, at least 1".to_owned(),
        },
        "f64" => "number".to_owned(),
        "SocketAddr" => "socket address (`ip:port`)".to_owned(),
        "PathBuf" => "file or directory path".to_owned(),
        "RedisUrl" => "Redis URL".to_owned(),
        "Secret" => "text (secret: never logged)".to_owned(),
        "String" => "text".to_owned(),
        _ if !accepted.is_empty() => format!(
            "one of {}",
            accepted
                .iter()
                .map(|v| format!("`{v}`"))
                .collect::<Vec<_>>()
                .join(", ")
        ),
        other => other.to_owned(),
    };
    if inner.len() < ty.len() {
        format!("{text}, optional")
    } else {
        text
    }
}

/// The default as the page shows it.
fn default_text(d: &Declared) -> String {
    match d.default_text().as_str() {
        "none" => "none".to_owned(),
        "" => "empty".to_owned(),
        text => format!("`{text}`"),
    }
}

/// The upstream variable(s) feeding the setting, as the page shows them.
fn upstream_text(d: &Declared) -> String {
    let vars = upstream::feeding(d.name);
    let Some((last, rest)) = vars.split_last() else {
        return "—".to_owned();
    };
    let quoted = |v: &&str| format!("`{v}`");
    match rest {
        [] => quoted(last),
        _ => format!(
            "{} and {}",
            rest.iter().map(quoted).collect::<Vec<_>>().join(", "),
            quoted(last)
        ),
    }
}

/// Plain text as Markdown that shows it as written: no emphasis from an
/// underscore at a word's edge (`_other_`) or an asterisk, no HTML, and no
/// table cell ended by a `|`. Underscores inside words (`failure_mode_deny`)
/// stay as they are, readable in the source.
fn escape(text: &str) -> String {
    let chars: Vec<char> = text.chars().collect();
    let mut out = String::with_capacity(text.len());
    for (i, &c) in chars.iter().enumerate() {
        let word = |j: Option<usize>| {
            j.and_then(|j| chars.get(j))
                .is_some_and(|c| c.is_alphanumeric())
        };
        match c {
            '_' if !(word(i.checked_sub(1)) && word(Some(i + 1))) => out.push_str("\\_"),
            '*' | '|' => {
                out.push('\\');
                out.push(c);
            }
            '<' => out.push_str("&lt;"),
            _ => out.push(c),
        }
    }
    out
}

/// The whole page.
pub fn render() -> String {
    let mut out = String::new();
    out.push_str(
        "<!-- Generated from the settings declaration (src/settings/mod.rs), the upstream\n     \
         variables (src/settings/upstream/) and the table of unsupported upstream\n     \
         variables (src/settings/unsupported.rs): do not edit by hand.\n     \
         Refresh: SLUICE_BLESS=1 cargo test --lib settings_reference -->\n\n",
    );
    out.push_str("# Settings reference\n\n");
    out.push_str(
        "`sluice serve` takes every setting from, in rising order of precedence: its default, \
         envoyproxy/ratelimit's variables (only as `ratelimit` or with `--settings-from \
         envoy-ratelimit`), the settings file (`--config PATH` or `SLUICE_CONFIG`, TOML or \
         YAML, keyed by the setting's name), the `SLUICE_…` environment variable, and the \
         flag. A bad value stops the start with one line naming where it came from and the \
         value, for example `sluice: invalid SLUICE_GRPC_ADDR=\"abc\": invalid socket address \
         syntax`. A settings-file key that is no setting is an error too.\n\n",
    );
    out.push_str("## Overview\n\n");
    out.push_str("| setting | environment variable | flag | default |\n|---|---|---|---|\n");
    for d in DECLARED {
        let _ = writeln!(
            out,
            "| [`{}`](#{}) | `{}` | `{}` | {} |",
            d.name,
            d.name,
            d.env(),
            d.flag(),
            default_text(d)
        );
    }
    out.push_str("\n## Settings\n");
    for d in DECLARED {
        let _ = write!(
            out,
            "\n### `{name}`\n\n{doc}.\n\n\
             | | |\n|---|---|\n\
             | type | {ty} |\n\
             | default | {default} |\n\
             | flag | `{flag} {value}` |\n\
             | environment variable | `{env}` |\n\
             | settings-file key | `{name}` |\n\
             | envoyproxy/ratelimit | {upstream} |\n",
            name = d.name,
            doc = escape(d.doc),
            ty = escape(&type_text(d)),
            default = escape(&default_text(d)),
            flag = d.flag(),
            value = d.value,
            env = d.env(),
            upstream = upstream_text(d),
        );
    }
    out.push_str(
        "\n## envoyproxy/ratelimit variables Sluice does not honour\n\n\
         Run as `ratelimit`, Sluice logs one warning at start for each of these that is set, \
         saying what it does instead. Every other variable envoyproxy/ratelimit reads is \
         honoured through the settings above.\n\n\
         | variable | what Sluice does instead |\n|---|---|\n",
    );
    for u in UNSUPPORTED {
        let _ = write!(out, "| `{}` | {}", u.name, escape(u.instead));
        if !u.same_as.is_empty() {
            let values: Vec<String> = u.same_as.iter().map(|v| format!("`{v}`")).collect();
            let _ = write!(
                out,
                " (no warning for {}, which is what Sluice does)",
                values.join(" or ")
            );
        }
        out.push_str(" |\n");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The committed page is the one the declaration renders.
    #[test]
    fn settings_reference() {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(PATH);
        let rendered = render();
        if std::env::var_os("SLUICE_BLESS").is_some() {
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(&path, &rendered).unwrap();
        }
        let committed = std::fs::read_to_string(&path).unwrap_or_default();
        assert!(
            committed == rendered,
            "{PATH} is not what the settings declaration renders; refresh it with\n    \
             SLUICE_BLESS=1 cargo test --lib settings_reference\nand commit it"
        );
    }

    #[test]
    fn every_setting_has_a_section_and_an_overview_row() {
        let page = render();
        for d in DECLARED {
            assert!(
                page.contains(&format!("\n### `{}`\n", d.name)),
                "{}",
                d.name
            );
            assert!(
                page.contains(&format!("| [`{}`](#{}) | `{}` |", d.name, d.name, d.env())),
                "{}",
                d.name
            );
        }
        for u in UNSUPPORTED {
            assert!(page.contains(&format!("| `{}` | ", u.name)), "{}", u.name);
        }
    }

    #[test]
    fn text_is_shown_as_written() {
        assert_eq!(escape("count as _other_"), "count as \\_other\\_");
        assert_eq!(
            escape("failure_mode_deny a|b <x> *"),
            "failure_mode_deny a\\|b &lt;x> \\*"
        );
    }

    #[test]
    fn types_read_as_words() {
        let find = |name: &str| DECLARED.iter().find(|d| d.name == name).unwrap();
        assert_eq!(
            type_text(find("redis_timeout_ms")),
            "whole number of milliseconds, at least 1"
        );
        assert_eq!(
            type_text(find("response_headers")),
            "one of `off`, `draft03`, `ietf`"
        );
        assert_eq!(type_text(find("rules")), "file or directory path, optional");
        assert_eq!(type_text(find("near_limit_ratio")), "number");
        assert_eq!(
            type_text(find("shutdown_delay_ms")),
            "whole number of milliseconds"
        );
        assert_eq!(
            type_text(find("breaker_failures")),
            "whole number, at least 1"
        );
    }
}
