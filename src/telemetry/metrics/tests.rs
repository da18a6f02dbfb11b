//! Unit tests of the metrics: names, values and bounds in the exposition.

use super::*;

fn labels(limit: &str, descriptor: &str) -> LimitLabels {
    LimitLabels {
        domain: "d".into(),
        limit: limit.into(),
        descriptor: descriptor.into(),
    }
}

#[test]
fn names_and_values_appear_in_the_exposition() {
    let m = Metrics::default();
    let event = LimitEvent {
        hits: 3,
        admitted: true,
        over: false,
        shadow: false,
        used: 9,
        capacity: 10,
    };
    m.record_limit(&labels("per-ip", ""), event);
    m.record_limit(
        &labels("per-ip", ""),
        LimitEvent {
            admitted: false,
            over: true,
            ..event
        },
    );
    m.record_request("OK", Duration::from_micros(300));
    let text = m.encode();
    for line in [
        r#"sluice_hits_total{domain="d",limit="per-ip",descriptor=""} 6"#,
        r#"sluice_admitted_total{domain="d",limit="per-ip",descriptor=""} 3"#,
        // Threshold floor(10 × 0.8) = 8; the counter went 6 → 9: one
        // hit above it.
        r#"sluice_near_limit_total{domain="d",limit="per-ip",descriptor=""} 1"#,
        r#"sluice_over_limit_total{domain="d",limit="per-ip",descriptor=""} 3"#,
        r#"sluice_requests_total{code="OK"} 1"#,
        "sluice_request_duration_seconds_count 1",
    ] {
        assert!(text.contains(line), "missing {line} in\n{text}");
    }
}

#[test]
fn shadow_hits_over_the_limit_are_not_over_limit() {
    let m = Metrics::default();
    let event = LimitEvent {
        hits: 1,
        admitted: true,
        over: true,
        shadow: true,
        used: 2,
        capacity: 1,
    };
    m.record_limit(&labels("s", ""), event);
    let text = m.encode();
    assert!(
        text.contains(r#"sluice_shadow_mode_total{domain="d",limit="s",descriptor=""} 1"#),
        "{text}"
    );
    assert!(!text.contains("sluice_over_limit_total{"), "{text}");

    // The counters cached for a rule's limit make all its series at
    // once, at zero until their event happens.
    m.limit_counters(&labels("t", "")).record(event);
    let text = m.encode();
    assert!(
        text.contains(r#"sluice_shadow_mode_total{domain="d",limit="t",descriptor=""} 1"#),
        "{text}"
    );
    assert!(
        text.contains(r#"sluice_over_limit_total{domain="d",limit="t",descriptor=""} 0"#),
        "{text}"
    );
}

#[test]
fn runtime_descriptor_labels_are_capped() {
    let m = Metrics::new(MetricsConfig {
        max_descriptor_labels: 3,
        ..MetricsConfig::default()
    });
    let values: Vec<String> = (0..1_000)
        .map(|i| m.descriptor_label(format!("ip={i}")))
        .collect();
    assert_eq!(&values[..3], ["ip=0", "ip=1", "ip=2"]);
    assert!(values[3..].iter().all(|v| v == OTHER));
    assert_eq!(
        m.descriptor_label("ip=1".into()),
        "ip=1",
        "known values keep their label"
    );
}

#[test]
fn weighted_hits_saturate_instead_of_wrapping() {
    let metrics = Metrics::new(MetricsConfig::default());
    let labels = LimitLabels {
        domain: "d".into(),
        limit: "l".into(),
        descriptor: String::new(),
    };
    let heavy = LimitEvent {
        hits: u64::MAX / 2 + 1,
        admitted: false,
        over: true,
        shadow: false,
        used: 0,
        capacity: 1,
    };
    let counters = metrics.limit_counters(&labels);
    counters.record(heavy);
    metrics.record_limit(&labels, heavy);
    metrics.record_limit(&labels, heavy);
    let text = metrics.encode();
    assert!(
        text.contains(&format!(
            r#"sluice_hits_total{{domain="d",limit="l",descriptor=""}} {}"#,
            u64::MAX
        )),
        "{text}"
    );
}

#[test]
fn near_limit_counts_only_hits_above_the_threshold_as_upstream_does() {
    let m = Metrics::default();
    let event = |limit: &str, hits, used, capacity| {
        m.record_limit(
            &labels(limit, ""),
            LimitEvent {
                hits,
                admitted: true,
                over: false,
                shadow: false,
                used,
                capacity,
            },
        )
    };
    // Limit 2, ratio 0.8: threshold 1. The first hit is not near.
    event("two", 1, 1, 2);
    // The second is.
    event("two", 1, 2, 2);
    // Limit 20: threshold 16; 7 hits taking it 10 → 17: one is near.
    event("twenty", 7, 17, 20);
    // Then 3 hits from 17 to 20: all three.
    event("twenty", 3, 20, 20);
    let text = m.encode();
    for line in [
        r#"sluice_near_limit_total{domain="d",limit="two",descriptor=""} 1"#,
        r#"sluice_near_limit_total{domain="d",limit="twenty",descriptor=""} 4"#,
    ] {
        assert!(text.contains(line), "missing {line} in\n{text}");
    }
}

#[test]
fn a_refused_reload_is_timed_apart_from_the_rules_in_force() {
    let m = Metrics::default();
    m.record_rules_loaded(100.0);
    m.record_reload(false, 200.0);
    let text = m.encode();
    for line in [
        "sluice_rules_loaded_timestamp_seconds 100.0",
        "sluice_rules_reload_error_timestamp_seconds 200.0",
        r#"sluice_rules_reloads_total{result="error"} 1"#,
    ] {
        assert!(text.contains(line), "missing {line} in\n{text}");
    }
    m.record_reload(true, 300.0);
    let text = m.encode();
    assert!(
        text.contains("sluice_rules_loaded_timestamp_seconds 300.0"),
        "{text}"
    );
}

#[test]
fn windows_are_labelled_as_the_rules_write_them() {
    for (ms, label) in [
        (1_000, "1s"),
        (60_000, "1m"),
        (90_000, "90s"),
        (3_600_000, "1h"),
        (86_400_000, "1d"),
        (1_500, "1500ms"),
    ] {
        assert_eq!(window_label(ms), label);
    }
}
