//! Answers from the local over-limit cache, and what the cache learns from
//! the store's answers. The cache answers only when the store's answer is
//! known (see `overlimit` for why), so both paths give the same decision.

use crate::limiter::{Millis, admits};
use crate::store::{Batch, LimitOutcome};

use super::Limiter;

impl<S> Limiter<S> {
    /// The store's per-limit outcomes for `batch`, known without calling
    /// it: only when every limit of the batch is a counter known full (for
    /// an item of weight 0 or counted always, and for a limit with a penalty
    /// box: known blocked, see `overlimit`), no item is a refund, and the roles make that a
    /// rejection (see `overlimit` for why the answer is then the store's).
    pub(super) fn answer_from_cache(
        &self,
        batch: &Batch,
        now: Millis,
    ) -> Option<Vec<LimitOutcome>> {
        let cache = self.cache.as_ref()?;
        if batch.items.is_empty()
            // A refund changes the counter whatever the answer: only the
            // store can apply it.
            || batch.items.iter().any(|item| item.refund)
            || admits(batch.items.iter().map(|item| (item.role, true)))
        {
            return None;
        }
        batch
            .items
            .iter()
            .flat_map(|item| item.limits.iter().map(move |limit| (item, limit)))
            .map(|(item, limit)| {
                // A full counter fits no hit, and counts nothing only when
                // the item counts with admission; a blocked one refuses and
                // counts nothing whatever the item. A refusal by a limit
                // with a penalty box that is not blocked yet is an offence,
                // which only the store can record.
                let blocks_only = item.hits == 0 || item.stands() || limit.penalty.is_some();
                cache.outcome(&item.identity, limit, blocks_only, now)
            })
            .collect()
    }

    /// Tells the cache what the store reported for every counter of `batch`.
    pub(super) fn learn(&self, batch: &Batch, results: &[LimitOutcome], now: Millis) {
        let Some(cache) = &self.cache else { return };
        let limits = batch
            .items
            .iter()
            .flat_map(|item| item.limits.iter().map(move |l| (item, l)));
        for ((item, limit), result) in limits.zip(results) {
            cache.learn(&item.identity, limit, result, now);
        }
    }
}
