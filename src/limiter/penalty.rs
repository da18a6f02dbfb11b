//! The penalty box: an identity a limit refuses is blocked for a while, and
//! for longer each time it offends again before its streak is forgotten.
//!
//! A [`Penalty`] is part of a limit (`penalty:` in the rules); a [`Block`]
//! is the state it keeps per counter, beside the algorithm's. Both stores
//! keep a block with its counter (Redis: fields `pu`, `pc`, `pf` of the
//! counter's prefix in the identity's HASH, see driver.lua) and evaluate it
//! in [`super::batch`]'s passes: a blocked limit is over for any weight
//! and counts nothing; a limit that is over when not blocked is an offence.

use super::Millis;

/// The most a block may last: a year. With an escalation factor of at most
/// [`MAX_ESCALATE`], every product stays far below 2^53, so the Redis
/// script's doubles compute the same blocks as this module.
pub const MAX_BLOCK_MS: Millis = 366 * 24 * 3_600_000;

/// The largest escalation factor.
pub const MAX_ESCALATE: u64 = 1_000;

/// How a limit punishes an identity it refuses.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Penalty {
    /// The first block's length (ms); never shorter than the limit's window.
    pub block_ms: Millis,
    /// Each further offence of a streak multiplies the block by this (1
    /// keeps it the same).
    pub escalate: u64,
    /// The longest block (ms), at least `block_ms`.
    pub max_block_ms: Millis,
    /// A streak is forgotten once this long has passed after its last
    /// block ended without a new offence (ms).
    pub forget_after_ms: Millis,
}

impl Penalty {
    /// The block for the `offences`-th offence of a streak (the first is 1):
    /// `block × escalate^(offences − 1)`, at most `max_block`.
    pub fn block_for(&self, offences: u64) -> Millis {
        let mut block = self.block_ms;
        if self.escalate > 1 {
            for _ in 1..offences {
                if block >= self.max_block_ms {
                    break;
                }
                block = block.saturating_mul(self.escalate);
            }
        }
        block.min(self.max_block_ms)
    }
}

/// A counter's penalty state: all zero when it never offended.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Block {
    /// Blocked before this instant.
    pub until: Millis,
    /// Offences of the current streak.
    pub offences: u64,
    /// From this instant the streak is forgotten (`until + forget_after`).
    pub forget_at: Millis,
}

impl Block {
    /// Milliseconds the block still lasts at `now`; 0 when not blocked.
    pub fn blocked_for(&self, now: Millis) -> Millis {
        self.until.saturating_sub(now)
    }

    /// An offence at `now`: the streak goes on (or starts again once
    /// forgotten), and the block starts now for as long as it says.
    pub fn offend(&mut self, penalty: &Penalty, now: Millis) {
        self.offences = if now < self.forget_at {
            self.offences.saturating_add(1)
        } else {
            1
        };
        self.until = now.saturating_add(penalty.block_for(self.offences));
        self.forget_at = self.until.saturating_add(penalty.forget_after_ms);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIN: Millis = 60_000;
    const LOGIN: Penalty = Penalty {
        block_ms: 15 * MIN,
        escalate: 2,
        max_block_ms: 60 * MIN,
        forget_after_ms: 24 * 60 * MIN,
    };

    #[test]
    fn blocks_double_up_to_the_longest_and_stay_there() {
        let blocks: Vec<_> = (1..=5).map(|n| LOGIN.block_for(n) / MIN).collect();
        assert_eq!(blocks, [15, 30, 60, 60, 60]);
        let flat = Penalty {
            escalate: 1,
            ..LOGIN
        };
        assert_eq!(flat.block_for(u64::MAX), 15 * MIN, "no loop over offences");
    }

    #[test]
    fn a_streak_goes_on_within_forget_after_and_starts_over_after_it() {
        let mut block = Block::default();
        block.offend(&LOGIN, 0);
        assert_eq!((block.until, block.offences), (15 * MIN, 1));
        assert_eq!(block.blocked_for(10 * MIN), 5 * MIN);
        block.offend(&LOGIN, 20 * MIN);
        assert_eq!((block.until, block.offences), (50 * MIN, 2));
        // Forgotten a day after the last block ended.
        block.offend(&LOGIN, block.forget_at);
        assert_eq!(block.offences, 1);
        assert_eq!(block.blocked_for(block.until), 0);
    }
}
