//! Loading the settings (precedence, errors naming their origin, values
//! that must be positive) and the declaration (flags, env, docs).

use super::*;
use std::path::Path;

/// An environment of exactly these variables.
pub(crate) fn env(pairs: &[(&str, &str)]) -> Option<config::Map<String, String>> {
    Some(
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
    )
}

/// The settings alone (the warnings are the upstream layer's tests').
pub(crate) fn load(
    file: Option<&Path>,
    flags: &SettingsFlags,
    env: Option<config::Map<String, String>>,
) -> Result<Settings, SettingsError> {
    Settings::load_from(file, flags, env).map(|loaded| loaded.settings)
}

mod loading {
    use super::super::*;
    use super::{env, load};

    #[test]
    fn defaults_apply_when_nothing_is_set() {
        let s = load(None, &SettingsFlags::default(), env(&[])).unwrap();
        assert_eq!(s, Settings::default());
        assert_eq!(s.grpc_addr.port(), 8081);
        assert_eq!(s.http_addr.port(), 8080);
    }

    #[test]
    fn file_then_env_then_flags_each_win() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("sluice.toml");
        std::fs::write(
            &file,
            "grpc_addr = \"127.0.0.1:1000\"\nmax_entries = 3\nlog_level = \"debug\"\n",
        )
        .unwrap();
        let flags = SettingsFlags {
            max_entries: Some(5),
            ..Default::default()
        };
        let s = load(
            Some(&file),
            &flags,
            env(&[
                ("SLUICE_GRPC_ADDR", "127.0.0.1:2000"),
                ("SLUICE_RESPONSE_HEADERS", "ietf"),
            ]),
        )
        .unwrap();
        assert_eq!(s.grpc_addr.port(), 2000);
        assert_eq!(s.max_entries, 5);
        assert_eq!(s.log_level, "debug");
        assert_eq!(s.response_headers, HeaderMode::Ietf);
    }

    #[test]
    fn a_typo_in_the_settings_file_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("sluice.toml");
        std::fs::write(&file, "grpc_adr = \"127.0.0.1:1000\"\n").unwrap();
        let err = load(Some(&file), &SettingsFlags::default(), env(&[])).unwrap_err();
        let text = err.to_string();
        assert!(
            text.contains("unknown setting 'grpc_adr'") && text.contains("grpc_addr"),
            "{text}"
        );
    }

    #[test]
    fn kubernetes_service_variables_are_ignored() {
        let s = load(
            None,
            &SettingsFlags::default(),
            env(&[
                ("SLUICE_SERVICE_HOST", "10.0.0.1"),
                ("SLUICE_PORT", "tcp://10.0.0.1:8081"),
            ]),
        )
        .unwrap();
        assert_eq!(s, Settings::default());
    }

    #[test]
    fn a_bad_value_is_one_line_naming_where_it_came_from_and_the_value() {
        let bad = |pairs: &[(&str, &str)]| {
            let err = load(None, &SettingsFlags::default(), env(pairs)).expect_err("a bad value");
            assert!(std::error::Error::source(&err).is_none(), "{err}");
            err.to_string()
        };
        assert_eq!(
            bad(&[("SLUICE_GRPC_ADDR", "abc")]),
            "invalid SLUICE_GRPC_ADDR=\"abc\": invalid socket address syntax"
        );
        assert_eq!(
            bad(&[("SLUICE_MAX_ENTRIES", "-3")]),
            "invalid SLUICE_MAX_ENTRIES=\"-3\": expected a whole number, 0 or more"
        );
        assert_eq!(
            bad(&[("SLUICE_LOG_FORMAT", "xml")]),
            "invalid SLUICE_LOG_FORMAT=\"xml\": expected one of human, json"
        );
        assert_eq!(
            bad(&[("SLUICE_SHADOW_MODE", "maybe")]),
            "invalid SLUICE_SHADOW_MODE=\"maybe\": expected true or false"
        );
        assert_eq!(
            bad(&[("SLUICE_TRACE_SAMPLING_RATIO", "2")]),
            "invalid SLUICE_TRACE_SAMPLING_RATIO=\"2\": the share of traces to export goes \
             from 0 (none) to 1 (all)"
        );
        for ratio in ["0", "1.5", "-0.2"] {
            assert_eq!(
                bad(&[("SLUICE_SOFT_RATIO", ratio)]),
                format!(
                    "invalid SLUICE_SOFT_RATIO=\"{ratio}\": must be a number above 0 and at \
                     most 1, e.g. 0.8"
                )
            );
        }
        assert_eq!(
            bad(&[("SLUICE_XDS_NODE_METADATA", "zone:a")]),
            "invalid SLUICE_XDS_NODE_METADATA=\"zone:a\": expected a JSON object, e.g. {\"zone\": \"a\"}"
        );
        // The settings file: its key, the value and the file.
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("sluice.toml");
        std::fs::write(&file, "grpc_addr = \"abc\"\n").unwrap();
        let err = load(Some(&file), &SettingsFlags::default(), env(&[]))
            .unwrap_err()
            .to_string();
        assert_eq!(
            err,
            format!(
                "invalid grpc_addr = \"abc\" in {}: invalid socket address syntax",
                file.display()
            )
        );
        // A variable wins over the file, and so is the one named.
        let err = load(
            Some(&file),
            &SettingsFlags::default(),
            env(&[("SLUICE_GRPC_ADDR", "def")]),
        )
        .unwrap_err()
        .to_string();
        assert!(err.starts_with("invalid SLUICE_GRPC_ADDR=\"def\""), "{err}");
        let err = load(
            Some(&dir.path().join("missing.toml")),
            &SettingsFlags::default(),
            env(&[]),
        )
        .unwrap_err()
        .to_string();
        assert!(
            err.starts_with("settings file: ") && err.contains("missing.toml"),
            "{err}"
        );
    }

    /// Every setting that must be positive (typed `NonZero…`).
    const POSITIVE: &[&str] = &[
        "redis_pool_size",
        "redis_timeout_ms",
        "breaker_failures",
        "grpc_max_connections",
        "http_max_connections",
        "handshake_timeout_ms",
        "idle_timeout_ms",
        "grpc_max_concurrent_streams",
        "grpc_max_request_bytes",
        "request_timeout_ms",
        "stats_flush_interval_ms",
    ];

    #[test]
    fn a_zero_where_it_must_be_positive_is_an_error_naming_the_setting() {
        use clap::Parser as _;
        #[derive(clap::Parser)]
        struct Cli {
            #[command(flatten)]
            flags: SettingsFlags,
        }
        let dir = tempfile::tempdir().unwrap();
        for name in POSITIVE {
            let var = format!("SLUICE_{}", name.to_ascii_uppercase());
            let err = load(None, &SettingsFlags::default(), env(&[(&var, "0")])).unwrap_err();
            assert_eq!(
                err.to_string(),
                format!("invalid {var}=\"0\": expected a whole number, 1 or more")
            );
            let flag = format!("--{}", name.replace('_', "-"));
            let cli = Cli::parse_from(["x", &flag, "0"]);
            let err = load(None, &cli.flags, env(&[])).unwrap_err();
            assert_eq!(
                err.to_string(),
                format!("invalid {flag} \"0\": expected a whole number, 1 or more")
            );
            let file = dir.path().join("sluice.toml");
            std::fs::write(&file, format!("{name} = 0\n")).unwrap();
            let err = load(Some(&file), &SettingsFlags::default(), env(&[])).unwrap_err();
            assert_eq!(
                err.to_string(),
                format!(
                    "invalid {name} = \"0\" in {}: expected a whole number, 1 or more",
                    file.display()
                )
            );
            for (value, why) in [
                ("-1", "expected a whole number, 1 or more"),
                ("soon", "expected a whole number"),
            ] {
                let err = load(None, &SettingsFlags::default(), env(&[(&var, value)]));
                assert_eq!(
                    err.unwrap_err().to_string(),
                    format!("invalid {var}={value:?}: {why}")
                );
            }
            let one = load(None, &SettingsFlags::default(), env(&[(&var, "1")]));
            assert!(one.is_ok(), "{name}: {one:?}");
        }
    }

    #[test]
    fn a_zero_from_upstreams_variables_is_an_error_naming_the_variable() {
        let flags = SettingsFlags {
            settings_from: Some(upstream::SettingsFrom::EnvoyRatelimit),
            ..Default::default()
        };
        for (var, value, setting) in [
            ("REDIS_POOL_SIZE", "0", "redis_pool_size"),
            ("REDIS_TIMEOUT", "0s", "redis_timeout_ms"),
            ("STATS_FLUSH_INTERVAL", "0", "stats_flush_interval_ms"),
        ] {
            let err = load(None, &flags, env(&[(var, value)])).unwrap_err();
            assert_eq!(
                err.to_string(),
                format!("invalid {setting} = \"0\" from {var}: expected a whole number, 1 or more")
            );
        }
    }
}

mod declaration {
    use super::super::*;
    use super::{env, load};
    use clap::CommandFactory as _;

    #[derive(clap::Parser)]
    struct Cli {
        #[command(flatten)]
        flags: SettingsFlags,
    }

    #[test]
    fn every_setting_is_declared_once_with_flag_env_and_doc() {
        let defaults = serde_json::to_value(Settings::default()).unwrap();
        let fields: Vec<&String> = defaults.as_object().unwrap().keys().collect();
        assert_eq!(fields.len(), DECLARED.len());
        let help = Cli::command().render_long_help().to_string();
        let mut seen = std::collections::HashSet::new();
        for d in DECLARED {
            assert!(seen.insert(d.name), "{} declared twice", d.name);
            assert!(fields.contains(&&d.name.to_string()), "{}", d.name);
            assert!(!d.doc.is_empty(), "{} has no doc", d.name);
            assert!(help.contains(&d.flag()), "{} has no flag", d.name);
            assert!(
                help.contains(&format!("[default: {}]", d.default_text())),
                "{}",
                d.name
            );
        }
    }

    #[test]
    fn a_new_setting_reads_from_env_and_the_flag_wins() {
        use clap::Parser as _;
        let cli = Cli::parse_from(["x", "--counting", "admitted", "--xds-backoff-max-ms", "5"]);
        let s = load(
            None,
            &cli.flags,
            env(&[
                ("SLUICE_COUNTING", "always"),
                ("SLUICE_SHADOW_MODE", "true"),
                ("SLUICE_XDS_SERVER", "eg:18001"),
                ("SLUICE_XDS_BACKOFF_MAX_MS", "9"),
                ("SLUICE_DEBUG_ADDR", "127.0.0.1:6070"),
                ("SLUICE_XDS_TLS", "true"),
            ]),
        )
        .unwrap();
        assert_eq!(s.counting, Counting::Admitted);
        assert!(s.shadow_mode);
        assert_eq!(s.xds_server.as_deref(), Some("eg:18001"));
        assert_eq!(s.xds_backoff_max_ms, 5);
        assert_eq!(s.debug_addr, Some(SocketAddr::from(([127, 0, 0, 1], 6070))));
        assert!(s.xds_tls);
        assert_eq!(Settings::default().counting, Counting::Admitted);
    }

    #[test]
    fn both_upstream_stats_sinks_at_once_stop_start_up() {
        use clap::Parser as _;
        let cli = Cli::parse_from(["x"]);
        let vars = [
            ("SLUICE_STATSD_ADDR", "statsd:8125"),
            ("SLUICE_UPSTREAM_PROMETHEUS_ADDR", "0.0.0.0:19001"),
        ];
        let error = load(None, &cli.flags, env(&vars)).unwrap_err();
        assert!(
            matches!(error, SettingsError::Unsupported { .. }),
            "{error}"
        );
    }

    #[test]
    fn a_certificate_without_its_key_is_an_error() {
        for var in [
            "SLUICE_GRPC_TLS_CERT",
            "SLUICE_XDS_TLS_KEY",
            "SLUICE_REDIS_TLS_CERT",
        ] {
            let err = load(None, &SettingsFlags::default(), env(&[(var, "/x.pem")])).unwrap_err();
            let text = err.to_string();
            assert!(
                text.starts_with(&format!("invalid {var}=\"/x.pem\": "))
                    && text.contains("go together"),
                "{text}"
            );
        }
    }
}
