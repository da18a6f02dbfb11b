//! EG-shaped rate-limit resources, and the calls that hit them.

use super::*;

// ------------------------------------------------------------ EG's rules

/// The name EG gives rule `rule` of HTTPRoute `default/backend` for host
/// www.example.com (dots become underscores).
pub(crate) fn route(rule: u32) -> String {
    format!("httproute/default/backend/rule/{rule}/match/0/www_example_com")
}

/// The descriptor entries Envoy sends for rule `rule`: the route, then the
/// rule's header match (`rule-<i>-match-0`, key = value for an exact match).
pub(crate) fn entries(rule: u32) -> [(String, String); 2] {
    let route = route(rule);
    let matched = format!("rule-{rule}-match-0");
    [(route.clone(), route), (matched.clone(), matched)]
}

/// EG's resource for [`DOMAIN`] with `rules`: `(rule, requests per hour)`.
pub(crate) fn eg_config(rules: &[(u32, u32)]) -> RateLimitConfig {
    eg_config_in(rules, RateLimitUnit::Hour)
}

pub(crate) fn eg_config_in(rules: &[(u32, u32)], unit: RateLimitUnit) -> RateLimitConfig {
    let descriptors = rules
        .iter()
        .map(|&(rule, requests)| {
            let [(route, _), (matched, _)] = entries(rule);
            RateLimitDescriptor {
                key: route.clone(),
                value: route,
                descriptors: vec![RateLimitDescriptor {
                    key: matched.clone(),
                    value: matched,
                    rate_limit: Some(RateLimitPolicy {
                        unit: unit as i32,
                        requests_per_unit: requests,
                        ..Default::default()
                    }),
                    ..Default::default()
                }],
                ..Default::default()
            }
        })
        .collect();
    RateLimitConfig {
        name: DOMAIN.into(),
        domain: DOMAIN.into(),
        descriptors,
    }
}

/// One ShouldRateLimit for rule `rule` over `channel`.
pub(crate) async fn hit(channel: &Channel, rule: u32) -> Result<Code, tonic::Status> {
    let [a, b] = entries(rule);
    let request = support::envoy_request(DOMAIN, &[&[(&a.0, &a.1), (&b.0, &b.1)]]);
    let reply = RateLimitServiceClient::new(channel.clone())
        .should_rate_limit(request)
        .await?;
    Ok(Code::try_from(reply.into_inner().overall_code).expect("a known code"))
}

/// `n` hits on `rule`, each of which must be answered.
pub(crate) async fn hits(channel: &Channel, rule: u32, n: usize) -> Vec<Code> {
    let mut codes = Vec::new();
    for _ in 0..n {
        codes.push(hit(channel, rule).await.expect("a decision"));
    }
    codes
}

/// `admitted` OKs then one OVER_LIMIT.
pub(crate) fn exactly(admitted: usize) -> Vec<Code> {
    let mut codes = vec![Code::Ok; admitted];
    codes.push(Code::OverLimit);
    codes
}
