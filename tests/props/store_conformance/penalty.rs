//! The penalty box's cases of the conformance suite: the same blocks,
//! escalations and reports from every store.

use super::*;
use Role::{Enforce, Shadow};
use sluice::limiter::Penalty;

/// Two minutes, doubled per offence up to five, forgotten ten minutes after
/// a block ends.
const BOX: Penalty = Penalty {
    block_ms: 120_000,
    escalate: 2,
    max_block_ms: 300_000,
    forget_after_ms: 600_000,
};

fn boxed(limit: LimitSpec) -> LimitSpec {
    LimitSpec {
        penalty: Some(BOX),
        ..limit
    }
}

/// `(over, blocked, reset_ms, full_for_ms)` of the first limit.
fn block_of(outcome: &BatchOutcome) -> (bool, bool, u64, u64) {
    let l = &outcome.limits[0];
    (l.over, l.blocked, l.reset_ms, l.full_for_ms)
}

/// Fills `limit` (2 a minute) for `name` and offends once; returns the
/// refused request's outcome.
async fn offend<S: CounterStore>(s: &S, name: &str, limit: LimitSpec) -> BatchOutcome {
    for _ in 0..2 {
        let o = apply(s, vec![item(name, &[limit], 1, Enforce)]).await;
        assert!(
            o.admitted && !o.limits[0].blocked,
            "{name}: under the limit"
        );
    }
    apply(s, vec![item(name, &[limit], 1, Enforce)]).await
}

/// For every algorithm with a window: the refusal blocks for two minutes;
/// while blocked even a check of weight 0 and an always-counted debit are
/// refused, count nothing and report the block's remaining time; when the
/// block ends the limit counts afresh; the next offences double the block
/// up to its longest, and a streak forgotten starts at two minutes again.
pub async fn a_penalty_box_blocks_escalates_and_forgets<S: CounterStore>(s: &S, c: &ManualClock) {
    let limits = [
        ("pen-sliding", sliding(2, 60_000, 6_000)),
        ("pen-fixed", fixed(2, 60_000)),
        ("pen-bucket", bucket(2, 60_000, 2)),
        ("pen-log", log(2, 60_000)),
    ];
    for (name, limit) in limits {
        let l = boxed(limit);
        c.set(T0);
        let o = offend(s, name, l).await;
        assert!(!o.admitted, "{name}");
        assert_eq!(block_of(&o), (true, true, 120_000, 120_000), "{name}");

        c.set(T0 + 61_000);
        let check = apply(s, vec![item(name, &[l], 0, Enforce)]).await;
        assert_eq!(
            block_of(&check),
            (true, true, 59_000, 59_000),
            "{name}: weight 0"
        );
        let charge = apply(s, vec![always(name, &[l], 1, Enforce)]).await;
        assert!(!charge.admitted, "{name}");
        assert_eq!(
            block_of(&charge),
            (true, true, 59_000, 59_000),
            "{name}: always"
        );

        // The block's end: nothing was counted during it, no new offence.
        c.set(T0 + 120_000);
        assert_eq!(
            used(s, name, limit).await,
            0,
            "{name}: nothing counted while blocked"
        );
        let o = offend(s, name, l).await;
        assert_eq!(
            block_of(&o),
            (true, true, 240_000, 240_000),
            "{name}: second offence"
        );

        c.set(T0 + 360_000);
        let o = offend(s, name, l).await;
        assert_eq!(
            block_of(&o).2,
            300_000,
            "{name}: third offence, at the longest"
        );

        // Ten minutes after that block ended the streak is forgotten.
        c.set(T0 + 660_000 + 600_000);
        let o = offend(s, name, l).await;
        assert_eq!(block_of(&o).2, 120_000, "{name}: a new streak");
    }
}

/// A blocked descriptor refuses its request: the request's other counters
/// count nothing (whatever slot they are in), and an always-counted debit
/// elsewhere stands as in any refused request.
pub async fn a_block_refuses_the_whole_request<S: CounterStore>(s: &S, c: &ManualClock) {
    c.set(T0);
    let l = boxed(fixed(2, 60_000));
    assert!(!offend(s, "pen-whole", l).await.admitted);
    let other = fixed(10, 60_000);
    let names: Vec<String> = (0..4).map(|i| format!("pen-whole-{i}")).collect();
    let mut items: Vec<BatchItem> = names
        .iter()
        .map(|n| item(n, &[other], 1, Enforce))
        .collect();
    items.push(always("pen-whole-always", &[other], 3, Shadow));
    items.push(item("pen-whole", &[l], 0, Enforce));
    let o = apply(s, items).await;
    assert!(!o.admitted);
    assert!(o.limits.last().expect("the blocked limit").blocked);
    for n in &names {
        assert_eq!(used(s, n, other).await, 0, "{n}");
    }
    assert_eq!(used(s, "pen-whole-always", other).await, 3);
}

/// In shadow mode the offence blocks all the same (reported, never
/// refusing), and nothing is counted on the limit while it is blocked.
pub async fn a_shadow_limit_is_blocked_without_refusing<S: CounterStore>(s: &S, c: &ManualClock) {
    c.set(T0);
    let l = boxed(fixed(1, 60_000));
    let first = apply(s, vec![item("pen-shadow", &[l], 1, Shadow)]).await;
    assert!(first.admitted && !first.limits[0].over);
    let second = apply(s, vec![item("pen-shadow", &[l], 1, Shadow)]).await;
    assert!(second.admitted, "shadow never refuses");
    assert_eq!(block_of(&second), (true, true, 120_000, 120_000));
    c.set(T0 + 60_000);
    let third = apply(s, vec![item("pen-shadow", &[l], 1, Shadow)]).await;
    assert!(third.admitted && third.limits[0].blocked);
    c.set(T0 + 120_000);
    assert_eq!(
        used(s, "pen-shadow", l).await,
        0,
        "nothing counted while blocked"
    );
}
