//! The flusher's bookkeeping of each queued request's timeout.

use super::*;
use crate::limiter::Window;

fn waiter(key: &str, deadline: Instant) -> Waiter {
    let window = Window {
        duration_ms: 60_000,
        algorithm: Algorithm::FixedWindow,
    };
    let limit = LimitSpec {
        requests: 5,
        window,
        penalty: None,
    };
    Waiter {
        request: Request {
            key: key.into(),
            limit,
            hits: 1,
        },
        tell: None,
        deadline,
    }
}

fn keys(members: &[Waiter]) -> Vec<&str> {
    members.iter().map(|m| m.request.key.as_str()).collect()
}

#[test]
fn who_waited_out_the_timeout_is_not_sent_and_the_call_waits_what_the_earliest_has_left() {
    let now = Instant::now();
    let ms = Duration::from_millis;
    let members = vec![
        waiter("late", now - ms(1)),
        waiter("later", now + ms(30)),
        waiter("due now", now),
        waiter("soonest", now + ms(10)),
    ];
    let (timed_out, waiting, within) = due(members, now);
    assert_eq!(keys(&timed_out), ["late", "due now"]);
    assert_eq!(keys(&waiting), ["later", "soonest"]);
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
    let (timed_out, waiting, within) = due(vec![waiter("late", now)], now);
    assert_eq!(
        (timed_out.len(), waiting.len(), within),
        (1, 0, Duration::ZERO)
    );
}
