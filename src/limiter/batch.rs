//! One request's batch, evaluated whole over counter states the caller
//! supplies: the decision both stores make, written once in Rust.
//!
//! A batch is its items (one per descriptor: weight, role, counting, refund)
//! and their limits, each counted on one of the batch's distinct counters (a
//! request may name one counter twice: two limits with one window, or two
//! descriptors with one identity). [`evaluate`] checks every limit, decides
//! whether the request is admitted, counts what must be counted and reports,
//! in the steps and the order of the Redis script's driver
//! (`src/store/redis/decide/driver.lua`), which mirrors it step for step:
//!
//! | driver.lua | here |
//! |---|---|
//! | *Plan the reads*: one state per distinct counter (and its block, for a limit with a penalty box) | the caller: [`Limit::counter`] indexes `states` and `blocks` |
//! | *Read*: every state loaded once and brought to `now` | the caller loads `states` and `blocks` (an absent counter is [`State::new`] and [`Block::default`]); [`State::used`] forgets what left the window |
//! | *Pass 1*: every limit checked as if every earlier limit of the request were counted; a blocked one is over (reply value 2) | [`check`]: `used`, `pending`, `over`, `blocked` per limit |
//! | *Admission* (no enforcing item over, not every quota item over; refunds take no part) | [`admitted`], with [`admits`] |
//! | *Pass 2*, two phases in request order: what stands whatever the request decides (refunds, always-counted debits), then the debits of an admitted request, none on a blocked counter; an over limit with a penalty box not blocked is an offence (`offend`); each limit reports after its turn | [`count`], in [`counting_order`] |
//! | *Write* (and a sliding log's *save*) | the caller stores `states` and `blocks` back |
//!
//! The driver's single path (one key, one limit) takes the same steps
//! without its records. Redis's own: a Cluster part's admission (the quota
//! rule left to the caller, who sees every part), the weights a coalesced
//! call carries after its limit, and the slot each write reports for
//! refund.lua.
//!
//! Pure: no IO, no clock, no allocation beyond the reports (none with
//! [`evaluate_into`], which writes them where the caller says); time is the
//! `now` argument. The memory store runs it inside its one critical section;
//! `tests/props/batch.rs` holds it to a naive model and to the algorithms.

use super::{Block, Counting, LimitSpec, Millis, Role, State, admits};

/// One item of a batch (one descriptor): how its limits take part.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Item {
    /// Weight counted on each of its limits; 0 only checks.
    pub hits: u64,
    /// How its verdict takes part in the request's.
    pub role: Role,
    /// Counted only with an admitted request, or always.
    pub counting: Counting,
    /// Gives `hits` back instead (never below empty, whatever the request
    /// decides); never over, no part in admission.
    pub refund: bool,
}

impl Item {
    /// Whether what it does stands whatever the request decides: a refund,
    /// or an always-counted debit (counted in pass 2's first phase).
    pub fn stands(&self) -> bool {
        self.refund || self.counting == Counting::Always
    }

    /// Whether its weight is added, given whether the request was admitted.
    pub fn counted(&self, admitted: bool) -> bool {
        self.hits > 0 && !self.refund && (admitted || self.counting == Counting::Always)
    }
}

/// One limit of a batch, in request order (items in order, then each item's
/// limits in order).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limit {
    /// Index of its item in the batch's items.
    pub item: usize,
    /// Index of its counter in the caller's states: limits that count on
    /// one counter share it.
    pub counter: usize,
    /// What it allows.
    pub spec: LimitSpec,
}

/// What the batch did to one limit: the values of the driver's reply.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Report {
    /// In use before the request (after it, for a refund).
    pub used: u64,
    /// Weight of earlier limits of the request on the same counter (0 for a
    /// refund).
    pub pending: u64,
    /// Whether its weight, with the pending weight, did not fit.
    pub over: bool,
    /// Milliseconds until headroom next grows, after its turn in pass 2.
    pub reset_ms: u64,
    /// For how long no hit at all fits, after its turn in pass 2.
    pub full_for_ms: u64,
    /// Whether its item's weight was added to its counter.
    pub counted: bool,
    /// Whether its counter is in its penalty box (blocked before the
    /// request, or by it: an offence); `reset_ms` and `full_for_ms` are then
    /// the block's remaining time, and nothing was counted on it unless the
    /// request itself was the offence.
    pub blocked: bool,
}

/// What [`evaluate`] decided.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Evaluation {
    /// Whether the request was admitted (the driver's `applied`).
    pub applied: bool,
    /// One report per limit, in request order.
    pub limits: Vec<Report>,
}

/// Evaluates a whole batch at `now` over `states` and `blocks`, one each
/// per distinct counter ([`Limit::counter`] indexes them), and leaves in
/// them what the caller must store. Every step is the driver's (see the
/// module's table).
///
/// # Panics
/// If a limit's `item` or `counter` is out of range.
pub fn evaluate(
    items: &[Item],
    limits: &[Limit],
    states: &mut [State],
    blocks: &mut [Block],
    now: Millis,
) -> Evaluation {
    let mut reports = vec![Report::default(); limits.len()];
    let applied = evaluate_into(items, limits, states, blocks, &mut reports, now);
    Evaluation {
        applied,
        limits: reports,
    }
}

/// [`evaluate`], writing the reports into `reports` (one per limit) and
/// returning whether the request was admitted: a caller that keeps the
/// reports in a buffer of its own (the memory store, on every request)
/// allocates nothing.
///
/// # Panics
/// If `reports` does not hold one report per limit, or a limit's `item` or
/// `counter` is out of range.
pub fn evaluate_into(
    items: &[Item],
    limits: &[Limit],
    states: &mut [State],
    blocks: &mut [Block],
    reports: &mut [Report],
    now: Millis,
) -> bool {
    assert_eq!(reports.len(), limits.len(), "one report per limit");
    check(items, limits, states, blocks, reports, now);
    let applied = admitted(items, limits, reports);
    count(items, limits, states, blocks, reports, applied, now);
    applied
}

/// Pass 1: per limit, the use of its counter at `now`, the weight of earlier
/// limits of the request on that counter, and whether its own weight does
/// not fit on top of both, written over `reports` (one per limit). A refund
/// only gives back: never over, and it adds nothing pending. A limit with a
/// penalty box whose counter is blocked is over, whatever the weight.
pub fn check(
    items: &[Item],
    limits: &[Limit],
    states: &mut [State],
    blocks: &[Block],
    reports: &mut [Report],
    now: Millis,
) {
    for (j, limit) in limits.iter().enumerate() {
        let item = &items[limit.item];
        let state = &mut states[limit.counter];
        let used = state.used(&limit.spec, now);
        // Reads only the reports of the limits before `j`, written already.
        let pending = pending_before(items, limits, reports, j);
        let blocked = !item.refund
            && limit.spec.penalty.is_some()
            && blocks[limit.counter].blocked_for(now) > 0;
        // Saturated: a sum past u64 fits no limit, never wraps.
        let over = blocked
            || !item.refund
                && !state.fits(&limit.spec, now, used, pending.saturating_add(item.hits));
        reports[j] = Report {
            used,
            pending,
            over,
            blocked,
            ..Report::default()
        };
    }
}

/// The weight pending on limit `j`'s counter: what the latest earlier limit
/// on it had pending, plus that limit's own weight unless it was a refund.
fn pending_before(items: &[Item], limits: &[Limit], reports: &[Report], j: usize) -> u64 {
    let counter = limits[j].counter;
    (0..j)
        .rev()
        .find(|&i| limits[i].counter == counter)
        .map_or(0, |i| {
            let item = &items[limits[i].item];
            let own = if item.refund { 0 } else { item.hits };
            reports[i].pending.saturating_add(own)
        })
}

/// Admission after pass 1 ([`admits`]): no enforcing item has a limit over,
/// and not every quota item has one. Refunds take no part.
pub fn admitted(items: &[Item], limits: &[Limit], reports: &[Report]) -> bool {
    admits(
        items
            .iter()
            .enumerate()
            .filter(|(_, item)| !item.refund)
            .map(|(i, item)| {
                let over = limits
                    .iter()
                    .zip(reports)
                    .any(|(limit, report)| limit.item == i && report.over);
                (item.role, over)
            }),
    )
}

/// The order of pass 2: first the limits whose item stands whatever the
/// request decides (refunds, always-counted debits), then the others, in
/// request order within each phase. Every store counts in this order, so a
/// counter shared by both kinds reports the same anywhere.
pub fn counting_order<'a>(
    items: &'a [Item],
    limits: &'a [Limit],
) -> impl Iterator<Item = usize> + 'a {
    let phase = move |stands: bool| {
        (0..limits.len()).filter(move |&j| items[limits[j].item].stands() == stands)
    };
    phase(true).chain(phase(false))
}

/// Pass 2: gives back each refund (its `used` is then what remains, nothing
/// pending), adds each counted weight (all of an admitted request's, or
/// only what stands; nothing on a blocked counter), and reports each
/// limit's reset and full time right after its turn. A limit with a penalty
/// box that is over and was not blocked is an offence: its counter is
/// blocked from now, and it reports the block.
pub fn count(
    items: &[Item],
    limits: &[Limit],
    states: &mut [State],
    blocks: &mut [Block],
    reports: &mut [Report],
    applied: bool,
    now: Millis,
) {
    for j in counting_order(items, limits) {
        let (limit, report) = (&limits[j], &mut reports[j]);
        let item = &items[limit.item];
        let state = &mut states[limit.counter];
        if item.refund {
            state.refund(&limit.spec, now, item.hits);
            report.used = state.used(&limit.spec, now);
            report.pending = 0;
        } else if item.counted(applied) && !report.blocked {
            state.add(&limit.spec, now, item.hits);
            report.counted = true;
        }
        report.reset_ms = state.reset_ms(&limit.spec, now);
        report.full_for_ms = state.full_for(&limit.spec, now);
        if let Some(penalty) = &limit.spec.penalty {
            let block = &mut blocks[limit.counter];
            if report.over && !report.blocked {
                block.offend(penalty, now);
                report.blocked = true;
            }
            if report.blocked {
                report.reset_ms = block.blocked_for(now);
                report.full_for_ms = report.reset_ms;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limiter::{Algorithm, Penalty, Window};

    const TEN_A_MINUTE: LimitSpec = LimitSpec {
        requests: 10,
        window: Window {
            duration_ms: 60_000,
            algorithm: Algorithm::FixedWindow,
        },
        penalty: None,
    };

    fn debit(hits: u64, role: Role) -> Item {
        Item {
            hits,
            role,
            counting: Counting::Admitted,
            refund: false,
        }
    }

    fn on(item: usize, counter: usize) -> Limit {
        Limit {
            item,
            counter,
            spec: TEN_A_MINUTE,
        }
    }

    #[test]
    fn a_counter_named_twice_sees_the_earlier_weight_pending() {
        let mut states = [State::new(&TEN_A_MINUTE)];
        let items = [debit(4, Role::Enforce), debit(7, Role::Enforce)];
        let out = evaluate(
            &items,
            &[on(0, 0), on(1, 0)],
            &mut states,
            &mut [Block::default(); 2],
            1_000,
        );
        assert!(!out.applied);
        assert_eq!((out.limits[1].pending, out.limits[1].over), (4, true));
        assert_eq!(states[0].used(&TEN_A_MINUTE, 1_000), 0, "nothing counted");
    }

    #[test]
    fn refunds_and_always_counted_debits_stand_when_refused() {
        let mut states = [State::new(&TEN_A_MINUTE), State::new(&TEN_A_MINUTE)];
        states[0].add(&TEN_A_MINUTE, 1_000, 5);
        let always = Item {
            counting: Counting::Always,
            ..debit(3, Role::Shadow)
        };
        let refund = Item {
            refund: true,
            ..debit(2, Role::Enforce)
        };
        let items = [debit(11, Role::Enforce), always, refund];
        let out = evaluate(
            &items,
            &[on(0, 1), on(1, 1), on(2, 0)],
            &mut states,
            &mut [Block::default(); 2],
            1_000,
        );
        assert!(!out.applied);
        assert_eq!(out.limits[2].used, 3, "the refund reports what remains");
        assert!(out.limits[1].counted && !out.limits[0].counted);
        assert_eq!(states[1].used(&TEN_A_MINUTE, 1_000), 3);
    }

    #[test]
    fn quota_items_reject_only_when_all_are_over() {
        let items = [debit(11, Role::Quota), debit(1, Role::Quota)];
        let mut states = [State::new(&TEN_A_MINUTE), State::new(&TEN_A_MINUTE)];
        let out = evaluate(
            &items,
            &[on(0, 0), on(1, 1)],
            &mut states,
            &mut [Block::default(); 2],
            0,
        );
        assert!(out.applied);
        assert!(
            out.limits[0].over && out.limits[0].counted,
            "admitted: counted too"
        );
    }

    const FIVE_MINUTES_BLOCKED: Penalty = Penalty {
        block_ms: 300_000,
        escalate: 2,
        max_block_ms: 3_600_000,
        forget_after_ms: 86_400_000,
    };

    fn boxed(item: usize) -> Limit {
        Limit {
            spec: LimitSpec {
                penalty: Some(FIVE_MINUTES_BLOCKED),
                ..TEN_A_MINUTE
            },
            ..on(item, 0)
        }
    }

    #[test]
    fn an_offence_blocks_the_counter_and_a_blocked_one_refuses_any_weight() {
        let (mut states, mut blocks) = ([State::new(&TEN_A_MINUTE)], [Block::default()]);
        states[0].add(&TEN_A_MINUTE, 1_000, 10);
        let out = evaluate(
            &[debit(1, Role::Enforce)],
            &[boxed(0)],
            &mut states,
            &mut blocks,
            1_000,
        );
        let report = out.limits[0];
        assert!(!out.applied && report.over && report.blocked);
        assert_eq!((report.reset_ms, report.full_for_ms), (300_000, 300_000));
        assert_eq!((blocks[0].until, blocks[0].offences), (301_000, 1));

        // After the window, the counter is empty but the block holds: a
        // check of weight 0 is over, nothing is counted, no new offence.
        let always = Item {
            counting: Counting::Always,
            ..debit(3, Role::Enforce)
        };
        for item in [debit(0, Role::Enforce), always] {
            let out = evaluate(&[item], &[boxed(0)], &mut states, &mut blocks, 200_000);
            assert!(!out.applied && out.limits[0].blocked && !out.limits[0].counted);
            assert_eq!(out.limits[0].reset_ms, 101_000);
        }
        assert_eq!(states[0].used(&TEN_A_MINUTE, 200_000), 0);
        assert_eq!(blocks[0].offences, 1, "no offence while blocked");

        // When the block ends the limit counts again; the next offence
        // doubles the block.
        let out = evaluate(
            &[debit(10, Role::Enforce)],
            &[boxed(0)],
            &mut states,
            &mut blocks,
            301_000,
        );
        assert!(out.applied && !out.limits[0].blocked);
        let out = evaluate(
            &[debit(1, Role::Enforce)],
            &[boxed(0)],
            &mut states,
            &mut blocks,
            302_000,
        );
        assert_eq!(out.limits[0].reset_ms, 600_000);
    }

    #[test]
    fn a_limit_without_a_penalty_ignores_the_block_of_its_counter() {
        let (mut states, mut blocks) = ([State::new(&TEN_A_MINUTE)], [Block::default()]);
        blocks[0].until = 5_000;
        let out = evaluate(
            &[debit(1, Role::Enforce)],
            &[on(0, 0)],
            &mut states,
            &mut blocks,
            1_000,
        );
        assert!(out.applied && !out.limits[0].blocked);
    }
}
