//! The scripts' wire format on the Rust side: every argument passed to
//! decide.lua, batch.lua and refund.lua, and how their replies read.

use redis::{Cmd, FromRedisValue, ParsingError, Value};

use crate::limiter::algorithm::SlidingWindow;
use crate::limiter::{Algorithm, Counting, LimitSpec, MAX_HITS, Millis, Role};
use crate::store::{BatchItem, LimitOutcome, counted_used};

pub(super) fn hits(hits: u64) -> i64 {
    i64::try_from(hits).unwrap_or(i64::MAX)
}

/// The role code decide.lua reads for an enforcing item counted only when
/// admitted (driver.lua: `0`).
pub(super) const ENFORCE: u8 = 0;

/// How decide.lua reads an item's role: enforce 0, shadow 1, quota 2,
/// refund 3, plus 4 when its hits count even if refused.
pub(super) fn role_code(item: &BatchItem) -> u8 {
    let role = match item.role {
        _ if item.refund => 3,
        Role::Enforce => ENFORCE,
        Role::Shadow => 1,
        Role::Quota => 2,
    };
    let always = item.counting == Counting::Always && !item.refund;
    role + if always { 4 } else { 0 }
}

/// Arguments per limit in both scripts' calls.
pub(super) const LIMIT_ARGS: usize = 4;

/// `requests, duration_ms, algorithm, param` of one limit, as both scripts
/// take them; a calendar period's are those of the period containing `now`
/// (the caller's clock: see calendar_window.lua).
pub(super) fn limit_args(limit: &LimitSpec, now: Millis) -> [i64; LIMIT_ARGS] {
    let int = |n: u64| i64::try_from(n).unwrap_or(i64::MAX);
    let mut duration_ms = limit.window.duration_ms;
    let (algorithm, param) = match limit.window.algorithm {
        Algorithm::SlidingWindow { precision_ms } => (0, precision_ms),
        Algorithm::FixedWindow => (1, 0),
        Algorithm::TokenBucket { burst } => (2, burst),
        Algorithm::SlidingLog => (3, 0),
        // A log of leased slots, kept apart from a sliding log of the same length.
        Algorithm::Concurrency => (3, 1),
        Algorithm::Calendar(calendar) => {
            let (start, end) = calendar.bounds(now);
            duration_ms = end - start;
            (4, start)
        }
    };
    [int(limit.requests), int(duration_ms), algorithm, int(param)]
}

/// One item's answers from its slot group, and whether the group counted it.
pub(super) type ItemPart = (Vec<Answer>, bool);

/// Values per limit in a decide.lua reply: a Cluster part also carries
/// the counter as it was before the request (see prelude.lua).
pub(super) const fn answer_len(whole: bool) -> usize {
    if whole { 6 } else { 8 }
}

/// One limit's answer from decide.lua.
#[derive(Clone, Copy, Debug)]
pub(super) struct Answer {
    pub(super) before: u64,
    pub(super) pending: u64,
    pub(super) over: bool,
    /// Whether its counter is in the limit's penalty box (the script's
    /// `over` is 2): reset and full are then the block's remaining time.
    pub(super) blocked: bool,
    /// Until headroom grows, before this request was counted.
    pub(super) reset_before: u64,
    /// The same after it was counted (equal when nothing was counted).
    pub(super) reset_after: u64,
    /// For how long no hit can fit, before this request was counted.
    pub(super) full_before: u64,
    /// The same after it was counted.
    pub(super) full_after: u64,
    /// The bucket or window the hits went to, for a refund.
    pub(super) slot: i64,
}

impl Answer {
    /// A batch.lua run's answer: the counter `before` the run, and after
    /// it (`reset`, `full`, the `slot` its hits went to); `over` is left
    /// false (see [`Overs`]).
    fn of_run(before: u64, reset: u64, full: u64, slot: i64) -> Self {
        Answer {
            before,
            pending: 0,
            over: false,
            blocked: false,
            reset_before: reset,
            reset_after: reset,
            full_before: full,
            full_after: full,
            slot,
        }
    }

    /// The outcome to report for `item`: after the request when it was
    /// admitted, the counter as it stands otherwise (also for a refunded
    /// Cluster part); an always-counted debit and a refund report the
    /// counter after them whatever the request decided (for a refund, the
    /// script's `before` is already the value after it).
    pub(super) fn outcome(self, item: &BatchItem, admitted: bool) -> LimitOutcome {
        let after = admitted || item.stands();
        LimitOutcome {
            used: counted_used(
                item.reports_counted(admitted),
                self.before,
                self.pending,
                item.hits,
            ),
            over: self.over,
            blocked: self.blocked,
            reset_ms: if after {
                self.reset_after
            } else {
                self.reset_before
            },
            full_for_ms: if after {
                self.full_after
            } else {
                self.full_before
            },
        }
    }
}

/// The per-limit answers of a decide.lua reply (`applied`, then the
/// answers) to a whole request or to a Cluster part (`whole` false).
pub(super) fn answers(reply: &[i64], whole: bool) -> impl Iterator<Item = Answer> + '_ {
    // A whole request's counters are never refunded: "before" is "after".
    let (reset_before, full_before) = if whole { (3, 4) } else { (6, 7) };
    reply[1..].chunks(answer_len(whole)).map(move |v| Answer {
        before: count(v[0]),
        pending: count(v[1]),
        over: v[2] >= 1,
        blocked: v[2] == 2,
        reset_before: count(v[reset_before]),
        reset_after: count(v[3]),
        full_before: count(v[full_before]),
        full_after: count(v[4]),
        slot: v[5],
    })
}

/// decide.lua's first two arguments: `now` ("" for Redis's clock) and
/// whether the call is the whole request ("all") or a Cluster part.
pub(super) fn push_head(cmd: &mut Cmd, now: Option<i64>, whole: &str) {
    match now {
        Some(now) => cmd.arg(now),
        None => cmd.arg(""),
    };
    cmd.arg(whole);
}

/// Arguments decide.lua takes per item, besides its limits' own.
pub(super) const ITEM_ARGS: usize = 3;

/// decide.lua's arguments for one item: role, hits, number of limits, and
/// each limit's. When one of its limits has a penalty box, the number is
/// negative and each limit's arguments are followed by its penalty's (see
/// `penalty_args`).
pub(super) fn push_item(cmd: &mut Cmd, item: &BatchItem, now: Millis) {
    let boxed = item.limits.iter().any(|limit| limit.penalty.is_some());
    let count = item.limits.len() as i64;
    cmd.arg(role_code(item))
        .arg(hits(item.hits))
        .arg(if boxed { -count } else { count });
    for limit in &item.limits {
        cmd.arg(&limit_args(limit, now)[..]);
        if boxed {
            cmd.arg(&penalty_args(limit)[..]);
        }
    }
}

/// `block_ms, escalate, max_block_ms, forget_after_ms` of a limit's penalty
/// box, as decide.lua takes them after the limit's own arguments; all 0
/// for a limit without one.
pub(super) fn penalty_args(limit: &LimitSpec) -> [i64; 4] {
    limit.penalty.map_or([0; 4], |p| {
        [p.block_ms, p.escalate, p.max_block_ms, p.forget_after_ms].map(hits)
    })
}

/// refund.lua's arguments for one item: number of limits, then per limit
/// its arguments, the slot decide.lua counted in, and the hits to give back.
pub(super) fn push_refund(
    args: &mut Vec<i64>,
    limits: &[LimitSpec],
    answers: &[Answer],
    n: u64,
    now: Millis,
) {
    args.push(answers.len() as i64);
    for (limit, answer) in limits.iter().zip(answers) {
        args.extend(limit_args(limit, now));
        args.extend([answer.slot, hits(n)]);
    }
}

/// batch.lua's second argument: which algorithms the call's distinct
/// `limits` (see `batch_limits`) use, by their codes (`limit_args`' third
/// value: 0 sliding window, 1 fixed window, 2 token bucket; the others are
/// never batched, see coalesce.rs's `shared_limit`), so that the script
/// builds only their functions.
pub(super) fn batch_algorithms(limits: &[[i64; LIMIT_ARGS]]) -> &'static str {
    let uses = |code: i64| limits.iter().any(|limit| limit[2] == code);
    match [uses(0), uses(1), uses(2)] {
        [true, false, false] => "0",
        [false, true, false] => "1",
        [false, false, true] => "2",
        [true, true, false] => "01",
        [true, false, true] => "02",
        [false, true, true] => "12",
        _ => "012",
    }
}

/// The distinct limits of a batch.lua call's runs, each listed once, and
/// for each run the number batch.lua names its limit by (1 for the first).
pub(super) fn batch_limits<'a>(
    limits: impl Iterator<Item = &'a LimitSpec>,
    now: Millis,
) -> (Vec<[i64; LIMIT_ARGS]>, Vec<usize>) {
    let mut distinct: Vec<[i64; LIMIT_ARGS]> = Vec::new();
    let of_run = limits
        .map(|limit| {
            let args = limit_args(limit, now);
            match distinct.iter().position(|d| *d == args) {
                Some(at) => at + 1,
                None => {
                    distinct.push(args);
                    distinct.len()
                }
            }
        })
        .collect();
    (distinct, of_run)
}

/// Arguments batch.lua takes for `limits` distinct limits, besides its
/// head (see `push_head`): how many, theirs, the packed runs and their
/// format (see `PackedRuns`).
pub(super) const fn batch_args(limits: usize) -> usize {
    3 + LIMIT_ARGS * limits
}

/// batch.lua's list of distinct limits: how many, then each one's arguments.
pub(super) fn push_limits(cmd: &mut Cmd, limits: &[[i64; LIMIT_ARGS]]) {
    cmd.arg(limits.len());
    for limit in limits {
        cmd.arg(&limit[..]);
    }
}

/// batch.lua's last two arguments. Its runs (one key and limit each) packed
/// as little-endian doubles (`struct.unpack` makes a double a Lua number
/// with less work than an 8-byte integer), per run its limit's number (see
/// `batch_limits`), the number of requests, and their weights in order.
/// Then the `struct` format of the values it may pack for runs it decides
/// itself (see `runs`), `<` and a `d` per value (per run two more than it
/// takes), whose start is the runs' format too: Lua's
/// `string.rep` makes such a string a byte at a time, about 6,000
/// instructions a call for each (callgrind), where Redis takes an argument
/// with a copy.
#[derive(Default)]
pub(super) struct PackedRuns {
    numbers: Vec<u8>,
    runs: usize,
}

impl PackedRuns {
    /// Room for `runs` runs of `requests` requests in all.
    pub(super) fn with_capacity(runs: usize, requests: usize) -> Self {
        Self {
            numbers: Vec::with_capacity(8 * (2 * runs + requests)),
            runs: 0,
        }
    }

    pub(super) fn push(&mut self, limit: usize, weights: impl ExactSizeIterator<Item = u64>) {
        self.runs += 1;
        self.number(limit as f64);
        self.number(weights.len() as f64);
        for weight in weights {
            // Past 2^53 a weight is rounded, as Lua would read its digits:
            // it is far over any limit either way.
            self.number(hits(weight) as f64);
        }
    }

    fn number(&mut self, n: f64) {
        self.numbers.extend(n.to_le_bytes());
    }

    /// The format of the values batch.lua may pack: `<`, then a `d` for
    /// each number of the runs and two more for each run.
    fn format(&self) -> String {
        let doubles = self.numbers.len() / 8 + 2 * self.runs;
        let mut format = String::with_capacity(1 + doubles);
        format.push('<');
        format.extend(std::iter::repeat_n('d', doubles));
        format
    }

    pub(super) fn push_to(&self, cmd: &mut Cmd) {
        cmd.arg(&self.numbers[..]).arg(self.format());
    }
}

/// How a script packs the numbers of a string reply: batch.lua's are
/// doubles (`struct.pack` writes a double with less work than an 8-byte
/// integer), the others' 8-byte integers (overrides.lua's text rides in
/// them).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Packing {
    Integers,
    Doubles,
}

/// A script's reply as integers: an array of them (decide.lua,
/// refund.lua), or one string of them packed little-endian as `packing`
/// says (batch.lua's and overrides.lua's, see their headers).
pub(super) fn script_reply(value: Value, packing: Packing) -> Result<Vec<i64>, ParsingError> {
    match value {
        Value::BulkString(bytes) => {
            let (packed, rest) = bytes.as_chunks::<8>();
            if !rest.is_empty() {
                return Err(format!("a packed reply of {} bytes", bytes.len()).into());
            }
            match packing {
                Packing::Integers => Ok(packed.iter().map(|b| i64::from_le_bytes(*b)).collect()),
                Packing::Doubles => {
                    // A loop, not `collect` into a `Result`, which cannot
                    // size the vector first.
                    let mut values = Vec::with_capacity(packed.len());
                    for b in packed {
                        values.push(integer(f64::from_le_bytes(*b))?);
                    }
                    Ok(values)
                }
            }
        }
        other => Vec::<i64>::from_redis_value(other),
    }
}

/// A packed double as the integer it must hold (every value a script
/// answers is an integer within 2^53, where a double is exact).
fn integer(n: f64) -> Result<i64, ParsingError> {
    const EXACT: f64 = 9_007_199_254_740_992.0;
    // Within 2^53, a double is an integer exactly when it survives the
    // round trip through `i64` (cheaper than `fract`, a library call).
    if n.abs() <= EXACT && (n as i64) as f64 == n {
        Ok(n as i64)
    } else {
        Err(format!("a packed reply holds {n}, not an integer").into())
    }
}

/// A count or a time a script answered, which is never negative (0 if
/// it were).
fn count(v: i64) -> u64 {
    u64::try_from(v).unwrap_or(0)
}

/// Values batch.lua answers for a run it decided, besides one per request.
const RUN_REPLY: usize = 4;

/// Values of a quick run's reply: the counter's markers as read (see
/// `sliding_window.lua`).
const MARKERS: usize = 6;

/// One run's part of a batch.lua reply.
pub(super) struct RunReply<'a> {
    /// See [`Answer::of_run`].
    pub(super) answer: Answer,
    /// Per request of the run, in order, whether it was over (not
    /// admitted).
    pub(super) overs: Overs<'a>,
}

/// Which requests of a run were over.
pub(super) enum Overs<'a> {
    /// As the script answered, one value per request: 1 if over.
    Replied(&'a [i64]),
    /// In turn, as the script decided them: a request is over when the
    /// counter before the run and what the run admitted before it leave no
    /// room for its weight under `requests`.
    InTurn { requests: u64 },
}

impl Overs<'_> {
    /// Whether the request that comes after `admitted` hits of the run's
    /// requests, its `index`th, weighing `hits`, was over; `None` past the
    /// values the script answered.
    pub(super) fn over(&self, index: usize, before: u64, admitted: u64, hits: u64) -> Option<bool> {
        match self {
            Overs::Replied(overs) => overs.get(index).map(|&v| v == 1),
            Overs::InTurn { requests } => {
                Some(before.saturating_add(admitted).saturating_add(hits) > *requests)
            }
        }
    }
}

/// A batch.lua reply read as its runs, each given as its limit and its
/// requests' weights in order; `None` when it does not read so.
pub(super) fn runs<'a, 'm, W>(
    reply: &'a [i64],
    shapes: impl Iterator<Item = (&'m LimitSpec, W)>,
) -> Option<Vec<RunReply<'a>>>
where
    W: ExactSizeIterator<Item = u64>,
{
    let (&now, mut rest) = reply.split_last()?;
    let now = u64::try_from(now).ok()?;
    let runs = shapes
        .map(|(limit, weights)| {
            let n = weights.len();
            if *rest.first()? >= 0 {
                let (markers, next) = rest.split_at_checked(MARKERS)?;
                rest = next;
                return decide_again(markers, limit, now, weights);
            }
            let (run, next) = rest.split_at_checked(RUN_REPLY + n)?;
            rest = next;
            let before = u64::try_from(-1 - run[0]).ok()?;
            let answer = Answer::of_run(before, count(run[1]), count(run[2]), run[3]);
            let overs = Overs::Replied(&run[RUN_REPLY..]);
            Some(RunReply { answer, overs })
        })
        .collect::<Option<Vec<_>>>()?;
    rest.is_empty().then_some(runs)
}

/// A quick run decided again from the markers batch.lua read, as the
/// script decided it (and the memory store would): each request in turn,
/// what they admitted counted at once. `None` for markers the quick path
/// would not have answered with.
fn decide_again<'a>(
    markers: &[i64],
    limit: &LimitSpec,
    now: Millis,
    weights: impl Iterator<Item = u64>,
) -> Option<RunReply<'a>> {
    let total = count(markers[0]);
    let oldest = (markers[1], count(markers[3]));
    let newest = (markers[2], count(markers[4]));
    let mut state = SlidingWindow::from_markers(limit, now, total, oldest, newest)?;
    let before = state.used(limit, now);
    let overs = Overs::InTurn {
        requests: limit.requests,
    };
    let admitted = weights.enumerate().fold(0u64, |admitted, (i, hits)| {
        if overs.over(i, before, admitted, hits) == Some(false) {
            admitted.saturating_add(hits)
        } else {
            admitted
        }
    });
    let counts = admitted.min(MAX_HITS.saturating_sub(total)) > 0;
    state.add(limit, now, admitted);
    let (reset, full) = (state.reset_ms(limit, now), state.full_for(limit, now));
    let slot = state.newest().filter(|_| counts).unwrap_or(-1);
    let answer = Answer::of_run(before, reset, full, slot);
    Some(RunReply { answer, overs })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_packed_reply_reads_as_its_little_endian_integers() {
        let mut bytes = Vec::new();
        for v in [7_i64, -1, 9_007_199_254_740_991] {
            bytes.extend(v.to_le_bytes());
        }
        let reply = script_reply(Value::BulkString(bytes), Packing::Integers).expect("packed");
        assert_eq!(reply, [7, -1, 9_007_199_254_740_991]);
    }

    #[test]
    fn a_reply_packed_in_doubles_reads_as_their_integers() {
        let mut bytes = Vec::new();
        for v in [7.0_f64, -1.0, 9_007_199_254_740_991.0, 0.0] {
            bytes.extend(v.to_le_bytes());
        }
        let reply = script_reply(Value::BulkString(bytes), Packing::Doubles).expect("packed");
        assert_eq!(reply, [7, -1, 9_007_199_254_740_991, 0]);
    }

    #[test]
    fn a_double_that_is_no_integer_is_refused() {
        for bad in [0.5_f64, f64::NAN, f64::INFINITY, 1e300] {
            let reply = script_reply(
                Value::BulkString(bad.to_le_bytes().to_vec()),
                Packing::Doubles,
            );
            assert!(reply.is_err(), "{bad} was read");
        }
    }

    #[test]
    fn a_batch_reply_reads_as_markers_decided_again_and_answers_as_replied() {
        let limit = |requests, algorithm| LimitSpec {
            requests,
            window: crate::limiter::Window {
                duration_ms: 60_000,
                algorithm,
            },
            penalty: None,
        };
        let sliding = limit(
            100,
            Algorithm::SlidingWindow {
                precision_ms: 6_000,
            },
        );
        let fixed = limit(10, Algorithm::FixedWindow);
        // At 600,000 ms the window's buckets are 90..=100. The quick run's
        // markers: 10 hits in buckets 95 (4) to 99 (6). The other run as
        // the script decided it: 7 before, reset 500, full 0, slot 3, not
        // over. Then now.
        let reply = [10, 95, 99, 4, 6, 0, -1 - 7, 500, 0, 3, 0, 600_000];
        let shapes = || {
            [(&sliding, vec![85_u64, 10, 5]), (&fixed, vec![1])]
                .into_iter()
                .map(|(l, w)| (l, w.into_iter()))
        };
        let runs = runs(&reply, shapes()).expect("reads");
        let quick = &runs[0].answer;
        // 85 fits, 10 more does not, 5 more does: 90 counted in bucket
        // 100; full until bucket 95 leaves.
        assert_eq!((quick.before, quick.slot), (10, 100));
        assert_eq!((quick.reset_after, quick.full_after), (36_000, 30_000));
        let overs: Vec<_> = [(0, 0, 85), (1, 85, 10), (2, 85, 5)]
            .map(|(i, admitted, hits)| runs[0].overs.over(i, 10, admitted, hits))
            .into();
        assert_eq!(overs, [Some(false), Some(true), Some(false)]);
        let decided = &runs[1].answer;
        assert_eq!(
            (decided.before, decided.reset_after, decided.slot),
            (7, 500, 3)
        );
        assert_eq!(runs[1].overs.over(0, 7, 0, 1), Some(false));
        assert_eq!(runs[1].overs.over(1, 7, 1, 1), None, "past the run");
        // Cut short, or with more than its runs, it does not read.
        assert!(super::runs(&reply[1..], shapes()).is_none());
        let mut longer = reply.to_vec();
        longer.insert(11, 0);
        assert!(super::runs(&longer, shapes()).is_none());
    }

    #[test]
    fn runs_are_packed_as_little_endian_doubles() {
        let mut runs = PackedRuns::default();
        runs.push(2, [1_u64, 5].into_iter());
        runs.push(1, [u64::MAX].into_iter());
        let numbers: Vec<f64> = runs
            .numbers
            .as_chunks::<8>()
            .0
            .iter()
            .map(|b| f64::from_le_bytes(*b))
            .collect();
        assert_eq!(numbers, [2.0, 2.0, 1.0, 5.0, 1.0, 1.0, i64::MAX as f64]);
        // Seven numbers, and four more values in the reply for the two runs.
        assert_eq!(runs.format(), format!("<{}", "d".repeat(11)));
    }

    #[test]
    fn a_packed_reply_cut_short_is_refused_and_an_array_still_reads() {
        for packing in [Packing::Integers, Packing::Doubles] {
            assert!(script_reply(Value::BulkString(vec![0; 12]), packing).is_err());
            let array = Value::Array(vec![Value::Int(3), Value::Int(-1)]);
            assert_eq!(script_reply(array, packing).expect("array"), [3, -1]);
        }
    }
}
