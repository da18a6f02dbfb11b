//! The flusher's bookkeeping: each queued request's timeout, and the runs a call decides.

use super::*;
use crate::limiter::Window;

/// A waiter for `key`, and where it is told its answer.
type Told = oneshot::Receiver<Result<Verdict, StoreError>>;

fn waiter(key: &str, deadline: Instant) -> (Waiter, Told) {
    let (tell, told) = oneshot::channel();
    let window = Window {
        duration_ms: 60_000,
        algorithm: Algorithm::FixedWindow,
    };
    let limit = LimitSpec {
        requests: 5,
        window,
        penalty: None,
    };
    let waiter = Waiter {
        request: Request {
            key: key.into(),
            limit,
            hits: 1,
        },
        tell: Some(tell),
        deadline,
    };
    (waiter, told)
}

/// Whether `told` was told the request timed out.
fn timed_out(told: &mut Told) -> bool {
    matches!(told.try_recv(), Ok(Err(StoreError::Timeout(_))))
}

fn keys(members: &[Waiter]) -> Vec<&str> {
    members.iter().map(|m| m.request.key.as_str()).collect()
}

#[test]
fn who_waited_out_the_timeout_is_not_sent_and_the_call_waits_what_the_earliest_has_left() {
    let now = Instant::now();
    let ms = Duration::from_millis;
    let keys_and_deadlines = [
        ("late", now - ms(1)),
        ("later", now + ms(30)),
        ("due now", now),
        ("soonest", now + ms(10)),
        ("gone", now + ms(5)),
    ];
    let (mut members, mut told): (Vec<_>, Vec<_>) = keys_and_deadlines
        .into_iter()
        .map(|(key, deadline)| waiter(key, deadline))
        .unzip();
    // Its caller stopped waiting: dropped, whatever its deadline.
    told.pop();
    let within = due(&mut members, now, ms(40));
    let timed_out: Vec<_> = told.iter_mut().map(timed_out).collect();
    assert_eq!(timed_out, [true, false, true, false]);
    assert_eq!(keys(&members), ["later", "soonest"]);
    assert_eq!(within, ms(10));
}

#[test]
fn a_timeout_too_long_for_the_clock_is_a_deadline_far_away_not_a_panic() {
    let year = Duration::from_secs(365 * 86_400);
    assert!(deadline_after(Duration::MAX) > Instant::now() + 50 * year);
    assert!(deadline_after(Duration::from_millis(u64::MAX)) > Instant::now() + 50 * year);
    let soon = deadline_after(Duration::from_millis(40));
    assert!(soon <= Instant::now() + Duration::from_millis(40));
}

#[test]
fn when_every_timeout_has_run_out_nothing_is_sent() {
    let now = Instant::now();
    let (late, mut told) = waiter("late", now);
    let mut members = vec![late];
    let within = due(&mut members, now, Duration::from_millis(40));
    assert_eq!(
        (timed_out(&mut told), members.len(), within),
        (true, 0, Duration::ZERO)
    );
}

#[test]
fn runs_gather_each_counter_in_order_and_a_key_under_another_limit_is_another_counter() {
    let now = Instant::now();
    let member = |key: &str, requests: u64, hits: u64| {
        let (mut waiter, _) = waiter(key, now);
        waiter.request.limit.requests = requests;
        waiter.request.hits = hits;
        waiter
    };
    let members = vec![
        member("a", 5, 1),
        member("b", 5, 2),
        member("a", 9, 3),
        member("a", 5, 4),
        member("c", 5, 5),
        member("a", 9, 6),
        member("b", 5, 7),
    ];
    let (members, lens) = in_runs(members);
    let order: Vec<_> = members
        .iter()
        .map(|m| {
            (
                m.request.key.as_str(),
                m.request.limit.requests,
                m.request.hits,
            )
        })
        .collect();
    assert_eq!(
        order,
        [
            ("a", 5, 1),
            ("a", 5, 4),
            ("b", 5, 2),
            ("b", 5, 7),
            ("a", 9, 3),
            ("a", 9, 6),
            ("c", 5, 5)
        ]
    );
    assert_eq!(lens, [2, 2, 2, 1]);
}
