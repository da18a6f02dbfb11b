use super::mapper::{Mapped, Mapper};
use super::statsd::packets;
use super::*;

#[test]
fn near_limit_follows_upstream() {
    // limit 10: near threshold floor(8.0) = 8.
    let c = RuleCounts::from_counter(10, 0, 1, false);
    assert_eq!((c.within_limit, c.near_limit, c.over_limit), (1, 0, 0));
    let c = RuleCounts::from_counter(10, 7, 2, false); // 7 -> 9
    assert_eq!((c.within_limit, c.near_limit, c.over_limit), (2, 1, 0));
    let c = RuleCounts::from_counter(10, 8, 1, false);
    assert_eq!((c.within_limit, c.near_limit), (1, 1));
    let c = RuleCounts::from_counter(10, 6, 7, true); // 6 -> 13: crosses both
    assert_eq!(
        (c.within_limit, c.near_limit, c.over_limit, c.shadow_mode),
        (0, 2, 3, 7)
    );
    let c = RuleCounts::from_counter(10, 10, 4, false);
    assert_eq!((c.over_limit, c.near_limit, c.total_hits), (4, 0, 4));
    let c = RuleCounts::local_cache(3, false);
    assert_eq!(
        (c.over_limit, c.over_limit_with_local_cache, c.shadow_mode),
        (3, 3, 0)
    );
}

#[test]
fn counters_are_named_like_upstream_and_flushed_as_deltas() {
    let s = UpstreamStats::new(100);
    s.rule("d.k_v", RuleCounts::from_counter(1, 1, 2, false));
    s.config_load(true);
    s.call_error(CallError::Store);
    assert_eq!(s.get("ratelimit.service.rate_limit.d.k_v.over_limit"), 2);
    assert_eq!(s.get("ratelimit.service.rate_limit.d.k_v.total_hits"), 2);
    assert_eq!(s.get("ratelimit.service.config_load_success"), 1);
    assert_eq!(
        s.get("ratelimit.service.call.should_rate_limit.redis_error"),
        1
    );
    let lines = s.statsd_lines();
    assert!(lines.contains(&"ratelimit.service.rate_limit.d.k_v.over_limit:2|c".to_string()));
    assert!(
        !lines.iter().any(|l| l.contains("within_limit")),
        "{lines:?}"
    );
    s.rule("d.k_v", RuleCounts::from_counter(1, 3, 1, false));
    let lines = s.statsd_lines();
    assert!(lines.contains(&"ratelimit.service.rate_limit.d.k_v.over_limit:1|c".to_string()));
    s.request(std::time::Duration::from_millis(3));
    let lines = s.statsd_lines();
    assert!(lines.contains(&"ratelimit_server.ShouldRateLimit.total_requests:1|c".to_string()));
    assert!(lines.contains(&"ratelimit_server.ShouldRateLimit.response_time:3|ms".to_string()));
}

#[test]
fn distinct_names_are_bounded() {
    let s = UpstreamStats::new(16);
    for i in 0..10 {
        s.rule(
            &format!("d.k_{i}"),
            RuleCounts::from_counter(5, 0, 1, false),
        );
    }
    assert_eq!(s.snapshot().len(), 16);
    assert!(s.dropped() > 0);
}

#[test]
fn packets_stay_below_the_limit() {
    let lines: Vec<String> = (0..100).map(|i| format!("a.b.c{i}:1|c")).collect();
    let p = packets(&lines, 100);
    assert!(p.iter().all(|p| p.len() <= 100));
    assert_eq!(p.join("\n").lines().count(), 100);
}

/// Envoy Gateway's statsd-exporter mapping, in shape: globs for one key,
/// regexes for two (later levels dropped).
pub const EG_MAPPING: &str = include_str!("../../../tests/fixtures/eg_statsd_mapping.yaml");

fn metric(name: &str, labels: &[(&str, &str)]) -> Mapped {
    Mapped::Metric {
        name: name.into(),
        labels: labels
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
    }
}

#[test]
fn glob_captures_one_segment_each() {
    let m = Mapper::parse(
        "mappings:\n - match: \"a.*.c.*\"\n   name: \"x_$1\"\n   labels: { second: \"$2\" }\n",
    )
    .unwrap();
    assert_eq!(m.map("a.b.c.d"), metric("x_b", &[("second", "d")]));
    assert_eq!(m.map("a.b.b.c.d"), metric("a_b_b_c_d", &[]));
}

#[test]
fn regex_and_drop() {
    let m = Mapper::parse(
        "mappings:\n - match: 'noise\\..*'\n   match_type: regex\n   action: drop\n - match: 'x\\.([0-9]+)'\n   match_type: regex\n   name: num\n   labels: { n: \"${1}\" }\n",
    )
    .unwrap();
    assert_eq!(m.map("noise.a.b"), Mapped::Drop);
    assert_eq!(m.map("x.42"), metric("num", &[("n", "42")]));
}

#[test]
fn bad_mapping_files_are_errors() {
    for bad in [
        "mappings: 3",
        "mappings:\n - name: x\n",
        "mappings:\n - match: 'a(('\n   match_type: regex\n   name: x\n",
        "mappings:\n - match: a\n   name: 'bad name'\n",
        "mappings:\n - match: a\n   match_type: fuzzy\n   name: x\n",
        "mappings: [\n",
    ] {
        assert!(Mapper::parse(bad).is_err(), "{bad}");
    }
}

#[test]
fn eg_mapping_gives_domain_key1_key2() {
    let m = Mapper::parse(EG_MAPPING).unwrap();
    assert_eq!(
        m.map("ratelimit.service.rate_limit.gw.k1_a.over_limit"),
        metric(
            "ratelimit_service_rate_limit_over_limit",
            &[("domain", "gw"), ("key1", "k1_a")]
        )
    );
    assert_eq!(
        m.map("ratelimit.service.rate_limit.gw.k1_a.k2_b.k3.over_limit"),
        metric(
            "ratelimit_service_rate_limit_over_limit",
            &[("domain", "gw"), ("key1", "k1_a"), ("key2", "k2_b")]
        )
    );
}

#[test]
fn default_mapping_matches_upstream_names() {
    let m = Mapper::default_mapping();
    assert_eq!(
        m.map("ratelimit.service.rate_limit.d.k1.k2_v.near_limit"),
        metric(
            "ratelimit_service_rate_limit_near_limit",
            &[("domain", "d"), ("key1", "k1"), ("key2", "k2_v")]
        )
    );
    assert_eq!(
        m.map("ratelimit.service.call.should_rate_limit.redis_error"),
        metric(
            "ratelimit_service_should_rate_limit_error",
            &[("err_type", "redis_error")]
        )
    );
    assert_eq!(
        m.map("ratelimit.service.config_load_error"),
        metric("ratelimit_service_config_load_error", &[])
    );
    let s = UpstreamStats::new(100);
    s.rule("d.k1_a", RuleCounts::from_counter(1, 1, 1, false));
    s.request(std::time::Duration::from_millis(2));
    let page = m.render(&s);
    assert!(
        page.contains("ratelimit_service_rate_limit_over_limit{domain=\"d\",key1=\"k1_a\"} 1"),
        "{page}"
    );
    assert!(
        page.contains("ratelimit_service_total_requests{grpc_method=\"ShouldRateLimit\"} 1"),
        "{page}"
    );
    assert!(
        page.contains(
            "ratelimit_service_response_time_seconds_count{grpc_method=\"ShouldRateLimit\"} 1"
        ),
        "{page}"
    );
}
