//! The decision semantics, pinned one by one through the gRPC handler
//! (called directly, no network) over the memory store and a manual clock.

use crate::support;

use sluice::decision::Bounds;
use sluice::headers::HeaderMode;
use sluice::proto as pb;
use sluice::proto::rate_limit_response::rate_limit::Unit;
use support::{Harness, OK, OVER, T0, descriptor, request};
use tonic::Code;

const RULES: &str = r#"
domain: test
descriptors:
  - key: key1
    value: value1
    rate_limit: {unit: second, requests_per_unit: 5}
  - key: key2
    rate_limit: {unit: minute, requests_per_unit: 20}
  - key: key2
    value: value3
  - key: key3
    rate_limit: {unit: hour, requests_per_unit: 10}
  - key: weighted
    rate_limit: {unit: minute, requests_per_unit: 5}
  - key: wild
    value: "foo*"
    rate_limit: {unit: minute, requests_per_unit: 3, name: foo-prefix}
  - key: wild
    value: "*"
    rate_limit: {unit: minute, requests_per_unit: 100, name: any-wild}
  - key: files
    value: "files/*"
    share_threshold: true
    rate_limit: {unit: hour, requests_per_unit: 2}
  - key: plan
    value: enterprise
    rate_limit: {unlimited: true}
  - key: shadow
    shadow_mode: true
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: quota_a
    quota_mode: true
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: quota_b
    quota_mode: true
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: route
    value: general
    rate_limit: {name: general, unit: minute, requests_per_unit: 100}
  - key: user
    value: premium
    rate_limit:
      unit: minute
      requests_per_unit: 3
      replaces: [{name: general}]
  - key: parent
    value: p
    descriptors:
      - key: child
        rate_limit: {unit: minute, requests_per_unit: 2}
  - key: gap
    rate_limits:
      - {unit: minute, requests_per_unit: 10, name: per-minute}
      - {unit: 2s, requests_per_unit: 1, name: min-gap}
  - key: fixed
    rate_limit: {unit: minute, requests_per_unit: 10, algorithm: fixed_window}
  - key: sliding
    rate_limit: {unit: minute, requests_per_unit: 10}
  - key: five_minutes
    rate_limit: {unit: 5m, requests_per_unit: 7}
"#;

fn status(
    response: &pb::RateLimitResponse,
    i: usize,
) -> &pb::rate_limit_response::DescriptorStatus {
    &response.statuses[i]
}

fn limit_of(response: &pb::RateLimitResponse, i: usize) -> (u32, Unit, String) {
    let l = status(response, i)
        .current_limit
        .as_ref()
        .expect("a current limit");
    (
        l.requests_per_unit,
        Unit::try_from(l.unit).unwrap(),
        l.name.clone(),
    )
}

fn reset_ms(response: &pb::RateLimitResponse, i: usize) -> i64 {
    let d = status(response, i)
        .duration_until_reset
        .expect("a reset duration");
    d.seconds * 1_000 + i64::from(d.nanos) / 1_000_000
}

#[tokio::test]
async fn unknown_domain_answers_ok_with_no_limit() {
    let h = Harness::new(RULES);
    let r = h
        .ok(request("nope", &[&[("key1", "value1")], &[("x", "y")]]))
        .await;
    assert_eq!(r.overall_code, OK);
    assert_eq!(r.statuses.len(), 2);
    for s in &r.statuses {
        assert_eq!(
            (s.code, s.limit_remaining, s.current_limit.is_none()),
            (OK, 0, true)
        );
        assert!(s.duration_until_reset.is_none());
    }
}

#[tokio::test]
async fn unknown_domain_ignores_the_request_limit_override() {
    let h = Harness::new(RULES);
    let mut req = request("nope", &[&[("a", "b")]]);
    req.descriptors[0].limit = Some(pb::rate_limit_descriptor::RateLimitOverride {
        requests_per_unit: 0,
        unit: pb::RateLimitUnit::Minute as i32,
    });
    let r = h.ok(req).await;
    assert_eq!(
        (r.overall_code, status(&r, 0).current_limit.is_none()),
        (OK, true)
    );
}

#[tokio::test]
async fn empty_domain_is_invalid_argument() {
    let h = Harness::new(RULES);
    let err = h
        .call(request("", &[&[("key1", "value1")]]))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
    assert!(
        err.message().contains("domain must not be empty"),
        "{}",
        err.message()
    );
}

#[tokio::test]
async fn empty_descriptor_list_is_invalid_argument() {
    let h = Harness::new(RULES);
    let err = h.call(request("test", &[])).await.unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
    assert!(
        err.message().contains("descriptor list must not be empty"),
        "{}",
        err.message()
    );
}

#[tokio::test]
async fn exactly_the_limit_is_admitted_then_over_limit_with_zero_remaining() {
    let h = Harness::new(RULES);
    for i in 0..5u32 {
        let r = h.ok(request("test", &[&[("key1", "value1")]])).await;
        assert_eq!(r.overall_code, OK, "call {i}");
        assert_eq!(status(&r, 0).limit_remaining, 4 - i);
        assert_eq!(limit_of(&r, 0), (5, Unit::Second, String::new()));
    }
    let r = h.ok(request("test", &[&[("key1", "value1")]])).await;
    assert_eq!(
        (
            r.overall_code,
            status(&r, 0).code,
            status(&r, 0).limit_remaining
        ),
        (OVER, OVER, 0)
    );
}

#[tokio::test]
async fn a_rejected_request_consumes_nothing() {
    let h = Harness::new(RULES);
    for _ in 0..5 {
        h.ok(request("test", &[&[("key1", "value1")]])).await;
    }
    // Hammer while over limit, half a second later: had these counted, their
    // bucket would still be in the window after the burst's bucket left.
    h.clock.advance(500);
    for _ in 0..50 {
        assert_eq!(
            h.ok(request("test", &[&[("key1", "value1")]]))
                .await
                .overall_code,
            OVER
        );
    }
    // The burst's 100 ms bucket has wholly left the 1 s window 1.1 s after it began.
    h.clock.advance(600);
    let r = h.ok(request("test", &[&[("key1", "value1")]])).await;
    assert_eq!((r.overall_code, status(&r, 0).limit_remaining), (OK, 4));
}

#[tokio::test]
async fn all_or_nothing_across_descriptors() {
    let h = Harness::new(RULES);
    // key3 allows 10 per hour, key2 20 per minute.
    for i in 0..10u32 {
        let r = h
            .ok(request("test", &[&[("key2", "a")], &[("key3", "b")]]))
            .await;
        assert_eq!(r.overall_code, OK);
        assert_eq!(
            (status(&r, 0).limit_remaining, status(&r, 1).limit_remaining),
            (19 - i, 9 - i)
        );
    }
    for _ in 0..5 {
        let r = h
            .ok(request("test", &[&[("key2", "a")], &[("key3", "b")]]))
            .await;
        assert_eq!(r.overall_code, OVER);
        // key2 passed its own check, so it is OK, but nothing was counted.
        assert_eq!(
            (status(&r, 0).code, status(&r, 0).limit_remaining),
            (OK, 10)
        );
        assert_eq!(
            (status(&r, 1).code, status(&r, 1).limit_remaining),
            (OVER, 0)
        );
    }
    let r = h.ok(request("test", &[&[("key2", "a")]])).await;
    assert_eq!(
        status(&r, 0).limit_remaining,
        9,
        "the rejected requests did not count on key2"
    );
}

#[tokio::test]
async fn request_hits_addend_weighs_every_descriptor_and_zero_means_one() {
    let h = Harness::new(RULES);
    let mut req = request("test", &[&[("weighted", "a")]]);
    req.hits_addend = 3;
    let r = h.ok(req.clone()).await;
    assert_eq!((r.overall_code, status(&r, 0).limit_remaining), (OK, 2));
    // 3 more do not fit: rejected, and the headroom of 2 is reported.
    let r = h.ok(req).await;
    assert_eq!((r.overall_code, status(&r, 0).limit_remaining), (OVER, 2));
    let mut req = request("test", &[&[("weighted", "a")]]);
    req.hits_addend = 0;
    let r = h.ok(req).await;
    assert_eq!((r.overall_code, status(&r, 0).limit_remaining), (OK, 1));
}

#[tokio::test]
async fn descriptor_hits_addend_wins_over_the_request_and_zero_only_checks() {
    let h = Harness::new(RULES);
    let mut req = request("test", &[&[("weighted", "a")], &[("key2", "x")]]);
    req.hits_addend = 2;
    req.descriptors[0].hits_addend = Some(5);
    let r = h.ok(req).await;
    assert_eq!(
        (status(&r, 0).limit_remaining, status(&r, 1).limit_remaining),
        (0, 18)
    );
    // At exactly the limit, a check-only descriptor is still OK and counts nothing.
    let mut check = request("test", &[&[("weighted", "a")]]);
    check.descriptors[0].hits_addend = Some(0);
    for _ in 0..3 {
        let r = h.ok(check.clone()).await;
        assert_eq!((r.overall_code, status(&r, 0).limit_remaining), (OK, 0));
    }
    let r = h.ok(request("test", &[&[("weighted", "a")]])).await;
    assert_eq!(r.overall_code, OVER);
}

#[tokio::test]
async fn shadow_mode_reports_ok_but_still_counts() {
    let h = Harness::new(RULES);
    let first = h.ok(request("test", &[&[("shadow", "s")]])).await;
    assert_eq!(
        (first.overall_code, status(&first, 0).limit_remaining),
        (OK, 0)
    );
    let r = h
        .ok(request("test", &[&[("shadow", "s")], &[("key2", "k")]]))
        .await;
    assert_eq!(r.overall_code, OK, "a shadow limit never rejects");
    assert_eq!((status(&r, 0).code, status(&r, 0).limit_remaining), (OK, 0));
    assert_eq!(limit_of(&r, 0).0, 1);
    assert_eq!(
        status(&r, 1).limit_remaining,
        19,
        "the request was admitted and counted"
    );
}

#[tokio::test]
async fn quota_mode_rejects_only_when_every_quota_descriptor_is_over() {
    let h = Harness::new(RULES);
    let both = || request("test", &[&[("quota_a", "1")], &[("quota_b", "1")]]);
    assert_eq!(
        h.ok(request("test", &[&[("quota_a", "1")]]))
            .await
            .overall_code,
        OK
    );
    let r = h.ok(both()).await;
    assert_eq!(r.overall_code, OK, "quota_b still had room");
    assert_eq!((status(&r, 0).code, status(&r, 1).code), (OVER, OK));
    let r = h.ok(both()).await;
    assert_eq!(r.overall_code, OVER);
    assert_eq!((status(&r, 0).code, status(&r, 1).code), (OVER, OVER));
}

#[tokio::test]
async fn unlimited_is_ok_with_max_remaining_and_no_limit() {
    let h = Harness::new(RULES);
    for _ in 0..3 {
        let r = h.ok(request("test", &[&[("plan", "enterprise")]])).await;
        assert_eq!(r.overall_code, OK);
        assert_eq!(status(&r, 0).limit_remaining, 4_294_967_295);
        assert!(status(&r, 0).current_limit.is_none());
    }
}

#[tokio::test]
async fn replaced_limits_are_neither_reported_nor_counted() {
    let h = Harness::new(RULES);
    let both = || request("test", &[&[("route", "general")], &[("user", "premium")]]);
    for i in 0..3u32 {
        let r = h.ok(both()).await;
        assert_eq!(r.overall_code, OK);
        assert!(status(&r, 0).current_limit.is_none(), "general is replaced");
        assert_eq!(status(&r, 0).limit_remaining, 0);
        assert_eq!(status(&r, 1).limit_remaining, 2 - i);
    }
    assert_eq!(h.ok(both()).await.overall_code, OVER);
    let r = h.ok(request("test", &[&[("route", "general")]])).await;
    assert_eq!(
        status(&r, 0).limit_remaining,
        99,
        "the replaced limit was never counted"
    );
}

#[tokio::test]
async fn a_value_without_a_limit_is_whitelisted() {
    let h = Harness::new(RULES);
    for _ in 0..30 {
        let r = h.ok(request("test", &[&[("key2", "value3")]])).await;
        assert_eq!(
            (r.overall_code, status(&r, 0).current_limit.is_none()),
            (OK, true)
        );
    }
    let r = h.ok(request("test", &[&[("key2", "other")]])).await;
    assert_eq!(limit_of(&r, 0).0, 20);
}

#[tokio::test]
async fn wildcards_match_in_file_order_after_exact_values() {
    let h = Harness::new(RULES);
    let r = h
        .ok(request(
            "test",
            &[&[("wild", "foobar")], &[("wild", "barfoo")]],
        ))
        .await;
    assert_eq!(limit_of(&r, 0), (3, Unit::Minute, "foo-prefix".into()));
    assert_eq!(limit_of(&r, 1), (100, Unit::Minute, "any-wild".into()));
    // Without share_threshold each value has its own counter.
    let r = h.ok(request("test", &[&[("wild", "foo1")]])).await;
    assert_eq!(status(&r, 0).limit_remaining, 2);
}

#[tokio::test]
async fn share_threshold_counts_all_matching_values_together() {
    let h = Harness::new(RULES);
    assert_eq!(
        h.ok(request("test", &[&[("files", "files/a.pdf")]]))
            .await
            .overall_code,
        OK
    );
    assert_eq!(
        h.ok(request("test", &[&[("files", "files/b.csv")]]))
            .await
            .overall_code,
        OK
    );
    let r = h.ok(request("test", &[&[("files", "files/c.txt")]])).await;
    assert_eq!((r.overall_code, limit_of(&r, 0).0), (OVER, 2));
}

#[tokio::test]
async fn a_limit_applies_only_at_the_depth_of_the_request() {
    let h = Harness::new(RULES);
    let r = h.ok(request("test", &[&[("parent", "p")]])).await;
    assert!(
        status(&r, 0).current_limit.is_none(),
        "shallower than the limit"
    );
    let r = h
        .ok(request("test", &[&[("parent", "p"), ("child", "c")]]))
        .await;
    assert_eq!(limit_of(&r, 0).0, 2);
    let r = h
        .ok(request(
            "test",
            &[&[("parent", "p"), ("child", "c"), ("extra", "e")]],
        ))
        .await;
    assert!(
        status(&r, 0).current_limit.is_none(),
        "deeper than the limit"
    );
    let r = h
        .ok(request("test", &[&[("key1", "value1"), ("x", "y")]]))
        .await;
    assert!(status(&r, 0).current_limit.is_none(), "deeper than a leaf");
}

#[tokio::test]
async fn the_request_limit_override_replaces_the_configured_limit() {
    let h = Harness::new(RULES);
    let mut req = request("test", &[&[("key2", "value3")]]);
    req.descriptors[0].limit = Some(pb::rate_limit_descriptor::RateLimitOverride {
        requests_per_unit: 2,
        unit: pb::RateLimitUnit::Hour as i32,
    });
    for remaining in [1, 0] {
        let r = h.ok(req.clone()).await;
        assert_eq!(
            (r.overall_code, status(&r, 0).limit_remaining),
            (OK, remaining)
        );
        assert_eq!(limit_of(&r, 0), (2, Unit::Hour, String::new()));
    }
    assert_eq!(h.ok(req).await.overall_code, OVER);
}

#[tokio::test]
async fn an_override_with_an_unknown_unit_is_invalid_argument() {
    let h = Harness::new(RULES);
    let mut req = request("test", &[&[("key2", "a")]]);
    req.descriptors[0].limit = Some(pb::rate_limit_descriptor::RateLimitOverride {
        requests_per_unit: 2,
        unit: 0,
    });
    assert_eq!(h.call(req).await.unwrap_err().code(), Code::InvalidArgument);
}

#[tokio::test]
async fn negative_hits_are_a_refund_not_an_error() {
    let h = Harness::new(RULES);
    let mut req = request("test", &[&[("key2", "a")]]);
    req.descriptors[0].is_negative_hits = true;
    // Refunds were INVALID_ARGUMENT before counting modes (issue 12); now
    // the weight is given back, never below empty, and the answer is OK.
    assert_eq!(h.ok(req).await.overall_code, OK);
}

#[tokio::test]
async fn several_limits_on_one_descriptor_enforce_a_minimum_gap() {
    let h = Harness::new(RULES);
    let gap = || request("test", &[&[("gap", "client")]]);
    let r = h.ok(gap()).await;
    assert_eq!(r.overall_code, OK);
    // The tightest limit is reported: the 1-per-2s one, now exhausted.
    assert_eq!(limit_of(&r, 0), (1, Unit::Unknown, "min-gap".into()));
    assert_eq!(status(&r, 0).limit_remaining, 0);
    h.clock.advance(1_000);
    let r = h.ok(gap()).await;
    assert_eq!(
        (r.overall_code, limit_of(&r, 0).2.as_str()),
        (OVER, "min-gap")
    );
    // The gap is never shorter than 2 s: the hit's 200 ms bucket counts in
    // full until it has wholly left the window.
    h.clock.advance(1_199);
    assert_eq!(
        h.ok(gap()).await.overall_code,
        OVER,
        "2.199 s after the first"
    );
    h.clock.advance(1);
    assert_eq!(h.ok(gap()).await.overall_code, OK, "2.2 s after the first");
    // Requests every 2.2 s run into the per-minute limit: 10 fit in any minute.
    let mut times = vec![0u64, 2_200];
    let mut now = 2_200;
    for _ in 0..40 {
        now += 2_200;
        h.clock.set(T0 + now);
        if h.ok(gap()).await.overall_code == OK {
            times.push(now);
        }
    }
    for (i, &t) in times.iter().enumerate() {
        let in_minute = times[i..].iter().take_while(|&&u| u < t + 60_000).count();
        assert!(
            in_minute <= 10,
            "{in_minute} admitted in the minute from {t}"
        );
    }
    assert!(times.len() > 10, "admissions resume as the minute slides");
}

#[tokio::test]
async fn fixed_window_resets_at_the_window_edge_and_reports_it() {
    let h = Harness::new(RULES);
    h.clock.set(T0 + 50_000);
    for _ in 0..10 {
        assert_eq!(
            h.ok(request("test", &[&[("fixed", "f")]]))
                .await
                .overall_code,
            OK
        );
    }
    let r = h.ok(request("test", &[&[("fixed", "f")]])).await;
    assert_eq!((r.overall_code, reset_ms(&r, 0)), (OVER, 10_000));
    h.clock.set(T0 + 60_000);
    let r = h.ok(request("test", &[&[("fixed", "f")]])).await;
    assert_eq!(
        (r.overall_code, status(&r, 0).limit_remaining),
        (OK, 9),
        "a new window: the edge burst fixed windows allow"
    );
}

#[tokio::test]
async fn sliding_window_blocks_the_edge_burst_a_fixed_window_allows() {
    let h = Harness::new(RULES);
    h.clock.set(T0 + 59_000);
    for _ in 0..10 {
        assert_eq!(
            h.ok(request("test", &[&[("sliding", "s")]]))
                .await
                .overall_code,
            OK
        );
    }
    h.clock.set(T0 + 60_000);
    assert_eq!(
        h.ok(request("test", &[&[("sliding", "s")]]))
            .await
            .overall_code,
        OVER
    );
    // At 119 s, 1 s of the 6 s bucket holding the burst is still in the
    // window: ceil(10 × 1/6) = 2 are counted, so 8 fit.
    h.clock.set(T0 + 119_000);
    let mut admitted = 0;
    for _ in 0..10 {
        if h.ok(request("test", &[&[("sliding", "s")]]))
            .await
            .overall_code
            == OK
        {
            admitted += 1;
        }
    }
    assert_eq!(admitted, 8);
}

#[tokio::test]
async fn sliding_window_reset_is_when_the_oldest_counted_bucket_expires() {
    let h = Harness::new(RULES);
    h.clock.set(T0 + 7_000); // bucket [6 s, 12 s) of a 60 s window
    let r = h.ok(request("test", &[&[("sliding", "s")]])).await;
    assert_eq!(reset_ms(&r, 0), 12_000 + 60_000 - 7_000);
}

#[tokio::test]
async fn a_window_that_is_not_a_named_unit_reports_unknown_unit() {
    let h = Harness::new(RULES);
    let r = h.ok(request("test", &[&[("five_minutes", "x")]])).await;
    assert_eq!(limit_of(&r, 0), (7, Unit::Unknown, String::new()));
}

#[tokio::test]
async fn statuses_follow_the_order_of_the_descriptors() {
    let h = Harness::new(RULES);
    let r = h
        .ok(request(
            "test",
            &[
                &[("plan", "enterprise")],
                &[("key1", "value1")],
                &[("nothing", "x")],
                &[("key3", "z")],
            ],
        ))
        .await;
    assert_eq!(r.statuses.len(), 4);
    assert_eq!(status(&r, 0).limit_remaining, u32::MAX);
    assert_eq!(limit_of(&r, 1).0, 5);
    assert!(status(&r, 2).current_limit.is_none());
    assert_eq!(limit_of(&r, 3).0, 10);
}

#[tokio::test]
async fn request_size_bounds_are_invalid_argument() {
    let bounds = Bounds {
        max_descriptors: 2,
        max_entries: 2,
        max_entry_bytes: 8,
        max_hits_addend: 100,
    };
    let h = Harness::with(RULES, HeaderMode::Off, bounds);
    let cases = [
        (
            request("test", &[&[("a", "b")], &[("a", "b")], &[("a", "b")]]),
            "too many descriptors",
        ),
        (
            request("test", &[&[("a", "b"), ("c", "d"), ("e", "f")]]),
            "entries",
        ),
        (request("test", &[&[("a", "123456789")]]), "bytes"),
        (request("test", &[&[("a123456789", "b")]]), "bytes"),
        (
            pb::RateLimitRequest {
                hits_addend: 101,
                ..request("test", &[&[("a", "b")]])
            },
            "hits_addend",
        ),
        (
            pb::RateLimitRequest {
                descriptors: vec![pb::RateLimitDescriptor {
                    hits_addend: Some(101),
                    ..descriptor(&[("a", "b")])
                }],
                ..request("test", &[])
            },
            "hits_addend",
        ),
    ];
    for (req, fragment) in cases {
        let err = h.call(req).await.unwrap_err();
        assert_eq!(err.code(), Code::InvalidArgument);
        assert!(
            err.message().contains(fragment),
            "{} should mention {fragment}",
            err.message()
        );
    }
}

#[tokio::test]
async fn draft03_headers_describe_the_tightest_descriptor() {
    let h = Harness::with(RULES, HeaderMode::Draft03, Bounds::default());
    h.clock.set(T0 + 2_000);
    let r = h
        .ok(request("test", &[&[("key2", "a")], &[("fixed", "b")]]))
        .await;
    let headers: Vec<(String, String)> = r
        .response_headers_to_add
        .iter()
        .map(|h| (h.key.clone(), h.value.clone()))
        .collect();
    assert_eq!(
        headers,
        vec![
            ("x-ratelimit-limit".into(), "10, 20;w=60, 10;w=60".into()),
            ("x-ratelimit-remaining".into(), "9".into()),
            ("x-ratelimit-reset".into(), "58".into()),
        ]
    );
}

#[tokio::test]
async fn ietf_headers_name_the_policy() {
    let h = Harness::with(RULES, HeaderMode::Ietf, Bounds::default());
    let r = h.ok(request("test", &[&[("wild", "foo")]])).await;
    let headers: Vec<(String, String)> = r
        .response_headers_to_add
        .iter()
        .map(|h| (h.key.clone(), h.value.clone()))
        .collect();
    assert_eq!(
        headers[0],
        ("ratelimit-policy".into(), "\"foo-prefix\";q=3;w=60".into())
    );
    assert!(
        headers[1].1.starts_with("\"foo-prefix\";r=2;t="),
        "{headers:?}"
    );
}

#[tokio::test]
async fn no_headers_when_no_descriptor_has_a_limit() {
    let h = Harness::with(RULES, HeaderMode::Draft03, Bounds::default());
    let r = h.ok(request("test", &[&[("plan", "enterprise")]])).await;
    assert!(r.response_headers_to_add.is_empty());
}

#[tokio::test]
async fn a_counter_named_twice_in_a_rejected_request_reports_one_headroom() {
    let h = Harness::new(RULES);
    h.ok(request("test", &[&[("weighted", "u")]])).await; // 1 of 5 used
    let mut req = request("test", &[&[("weighted", "u")], &[("weighted", "u")]]);
    req.descriptors[0].hits_addend = Some(2);
    req.descriptors[1].hits_addend = Some(3);
    let r = h.ok(req).await;
    assert_eq!(r.overall_code, OVER, "1 + 2 + 3 > 5");
    assert_eq!((status(&r, 0).code, status(&r, 1).code), (OK, OVER));
    assert_eq!(
        (status(&r, 0).limit_remaining, status(&r, 1).limit_remaining),
        (4, 4)
    );
}

#[tokio::test]
async fn an_overlong_domain_is_invalid_argument() {
    let bounds = Bounds {
        max_entry_bytes: 8,
        ..Bounds::default()
    };
    let h = Harness::with(RULES, HeaderMode::Off, bounds);
    let err = h
        .call(request("a-domain-name-too-long", &[&[("a", "b")]]))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
    assert!(err.message().contains("domain"), "{}", err.message());
}

/// The manual's (docs/src/algorithms.md) "at most 10 per minute and at least 2 seconds between
/// requests" rules, word for word.
const MINIMUM_GAP: &str = r#"
domain: gap
descriptors:
  - key: api_key
    rate_limits:
      - {unit: minute, requests_per_unit: 10}
      - {unit: 2s, requests_per_unit: 1, algorithm: sliding_log}
"#;

#[tokio::test]
async fn the_minimum_gap_example_allows_ten_per_minute_two_seconds_apart() {
    let h = Harness::new(MINIMUM_GAP);
    let call = || request("gap", &[&[("api_key", "k")]]);
    let mut admitted = Vec::new();
    // Try every 500 ms for 3 minutes.
    for step in 0..360u64 {
        h.clock.set(T0 + step * 500);
        if h.ok(call()).await.overall_code == OK {
            admitted.push(step * 500);
        }
    }
    for pair in admitted.windows(2) {
        assert!(pair[1] - pair[0] >= 2_000, "{} ms apart", pair[1] - pair[0]);
    }
    for (i, &t) in admitted.iter().enumerate() {
        let in_minute = admitted[i..]
            .iter()
            .take_while(|&&u| u < t + 60_000)
            .count();
        assert!(in_minute <= 10, "{in_minute} in the minute from {t}");
    }
    // Exactly 2 s apart while the minute allows, so the first 10 come at 0, 2, …, 18 s.
    assert_eq!(
        &admitted[..10],
        &(0..10).map(|i| i * 2_000).collect::<Vec<_>>()[..]
    );
    assert!(
        admitted.len() >= 25,
        "admissions resume as the minute slides: {}",
        admitted.len()
    );
}

#[tokio::test]
async fn token_bucket_reports_tokens_as_remaining_and_the_next_token_as_reset() {
    let h = Harness::new(
        "domain: tb\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 10, algorithm: token_bucket, burst: 3}\n",
    );
    let call = || request("tb", &[&[("k", "v")]]);
    for remaining in [2, 1, 0] {
        let r = h.ok(call()).await;
        assert_eq!(
            (r.overall_code, status(&r, 0).limit_remaining),
            (OK, remaining)
        );
        assert_eq!(limit_of(&r, 0), (10, Unit::Second, String::new()));
    }
    let r = h.ok(call()).await;
    assert_eq!(
        (
            r.overall_code,
            status(&r, 0).limit_remaining,
            reset_ms(&r, 0)
        ),
        // The next token is 100 ms away; a refusal reports whole seconds
        // (Envoy's x-ratelimit-reset drops the fraction: never "reset 0").
        (OVER, 0, 1_000)
    );
    h.clock.advance(100);
    assert_eq!(h.ok(call()).await.overall_code, OK);
}

/// Issue 11, item 12: weights whose sum would wrap u64, or pass 2^53 − 1
/// (where the Redis scripts' doubles stop being exact), are refused whatever
/// `max_hits_addend` says, and count nothing.
#[tokio::test]
async fn weights_beyond_exact_arithmetic_are_invalid_and_count_nothing() {
    use sluice::limiter::MAX_HITS;
    let yaml = "domain: w\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute, requests_per_unit: 5}\n";
    let bounds = Bounds {
        max_hits_addend: u64::MAX,
        ..Bounds::default()
    };
    let h = Harness::with(yaml, HeaderMode::Off, bounds);
    let weighted = |weights: &[u64]| pb::RateLimitRequest {
        domain: "w".into(),
        descriptors: weights
            .iter()
            .map(|&w| pb::RateLimitDescriptor {
                hits_addend: Some(w),
                ..descriptor(&[("k", "v")])
            })
            .collect(),
        hits_addend: 0,
    };
    for (weights, fragment) in [
        (
            &[1, u64::MAX][..],
            "larger than the maximum 9007199254740991",
        ),
        (
            &[MAX_HITS + 1][..],
            "larger than the maximum 9007199254740991",
        ),
        (&[MAX_HITS, 1][..], "add up to more than 9007199254740991"),
    ] {
        let err = h.call(weighted(weights)).await.unwrap_err();
        assert_eq!(err.code(), Code::InvalidArgument, "{weights:?}");
        assert!(err.message().contains(fragment), "{}", err.message());
    }
    let at_cap = h.ok(weighted(&[MAX_HITS])).await;
    assert_eq!(
        at_cap.overall_code, OVER,
        "the cap itself is a valid weight"
    );
    for _ in 0..5 {
        assert_eq!(h.ok(weighted(&[1])).await.overall_code, OK);
    }
    assert_eq!(h.ok(weighted(&[1])).await.overall_code, OVER);
}
