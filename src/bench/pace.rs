//! The pacer of `sluice bench --rate`: requests released at a fixed rate,
//! each timed from when it was due.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Releases requests at a fixed rate to whichever worker is free. Request
/// `n` is due at `start + n / rate`; latency counts from then, so time a
/// due request waits (for a free worker, or because the pacer thread was
/// not scheduled) counts against the server: no coordinated omission.
pub(super) struct Pacer {
    start: Instant,
    rate: f64,
    /// One permit per released request: each release wakes one waiting
    /// worker, not all of them (waking every idle worker on every step
    /// cost the load generator CPU that it shares with the server).
    /// Closed when the run stops.
    released: tokio::sync::Semaphore,
    /// Requests taken by workers, so the next one's due time.
    claimed: AtomicU64,
}

impl Pacer {
    /// Starts releasing `rate` requests per second until `stopped` says so. A
    /// thread of its own with a 100 µs step: Tokio's timer ticks in whole
    /// milliseconds, which would release requests in bursts that queue
    /// behind each other and show as latency the server did not add.
    /// Memory stays constant however far the server falls behind.
    pub(super) fn start(rate: f64, stopped: impl Fn() -> bool + Send + 'static) -> Arc<Self> {
        let pacer = Arc::new(Self {
            start: Instant::now(),
            rate,
            released: tokio::sync::Semaphore::new(0),
            claimed: AtomicU64::new(0),
        });
        let stepper = pacer.clone();
        std::thread::spawn(move || {
            let mut so_far = 0;
            while !stopped() {
                std::thread::sleep(Duration::from_micros(100));
                let due = due_by(stepper.start.elapsed(), stepper.rate);
                let more = usize::try_from(due - so_far).unwrap_or(usize::MAX);
                // Only the pacer adds permits; past the semaphore's bound
                // (an absurd rate, or a server silent for ages) requests
                // stay unreleased rather than panic.
                let room =
                    tokio::sync::Semaphore::MAX_PERMITS - stepper.released.available_permits();
                stepper.released.add_permits(more.min(room));
                so_far = due;
            }
            stepper.released.close();
        });
        pacer
    }

    /// When the next request was due (request `n` at `start + n / rate`);
    /// `None` once the run stopped.
    pub(super) async fn next(&self) -> Option<Instant> {
        self.released.acquire().await.ok()?.forget();
        let claimed = self.claimed.fetch_add(1, Ordering::Relaxed);
        Some(self.start + Duration::from_secs_f64(claimed as f64 / self.rate))
    }
}

/// How many requests are due `elapsed` into a run at `rate` per second:
/// request `n` (from 0) is due at `n / rate`, so the first is due at once.
/// (Counting only whole intervals released each request one interval
/// after its due time, and every paced latency carried that interval.)
fn due_by(elapsed: Duration, rate: f64) -> u64 {
    (elapsed.as_secs_f64() * rate) as u64 + 1
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_paced_request_is_released_when_it_is_due_not_an_interval_later() {
        // At 1,000/s request n is due at n ms.
        assert_eq!(
            due_by(Duration::ZERO, 1000.0),
            1,
            "request 0 is due at the start"
        );
        assert_eq!(due_by(Duration::from_micros(999), 1000.0), 1);
        assert_eq!(
            due_by(Duration::from_millis(1), 1000.0),
            2,
            "request 1 is due at 1 ms"
        );
        assert_eq!(due_by(Duration::from_millis(5), 200.0), 2);
        assert_eq!(due_by(Duration::from_millis(4), 200.0), 1);
    }
}
