//! The streams of one HTTP/2 connection, run inside the connection's own
//! task rather than a task each.
//!
//! hyper hands every stream it accepts to an executor. With a task per
//! stream, each stream that finishes wakes the connection's task, which
//! Tokio runs next (its LIFO slot) to write that one response: a write
//! system call per answer, even when a read or a batch of Redis replies
//! woke many streams at once (measured: 1.18 `writev` per decision with
//! Redis). Run here, every stream that can go on does so first, and the
//! connection then writes all their answers together. The streams of one
//! connection share its thread, as its HTTP/2 framing already does; clients
//! spread over connections (Envoy opens one per worker) spread over cores.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use futures_util::StreamExt;
use futures_util::stream::FuturesUnordered;
use parking_lot::Mutex;

type Stream = Pin<Box<dyn Future<Output = ()> + Send>>;

/// Turns in one poll: the connection, then its streams, then the
/// connection again to write what they answered, and so on. Past this the
/// task yields (and is woken again at once), so that one busy connection
/// does not hold its thread.
const TURNS: usize = 8;

/// hyper's executor for one connection: keeps what it is handed for the
/// connection's [`Running`].
#[derive(Clone, Default)]
pub(crate) struct Streams(Arc<Mutex<Vec<Stream>>>);

impl<F> hyper::rt::Executor<F> for Streams
where
    F: Future<Output = ()> + Send + 'static,
{
    fn execute(&self, stream: F) {
        // hyper calls this only while the connection is polled (accepting
        // a stream), so `Running::drive` takes it before that poll ends.
        self.0.lock().push(Box::pin(stream));
    }
}

/// The streams a connection runs.
#[derive(Default)]
pub(crate) struct Running {
    handed: Streams,
    streams: FuturesUnordered<Stream>,
}

impl Running {
    /// The executor whose streams this runs.
    pub(crate) fn executor(&self) -> Streams {
        self.handed.clone()
    }

    /// Polls `connection` and the streams it starts, in turns, until
    /// neither has anything more to do, or the connection ends.
    pub(crate) fn drive<T>(
        &mut self,
        cx: &mut Context<'_>,
        mut connection: impl FnMut(&mut Context<'_>) -> Poll<T>,
    ) -> Poll<T> {
        for _ in 0..TURNS {
            if let Poll::Ready(done) = connection(cx) {
                return Poll::Ready(done);
            }
            let mut busy = false;
            {
                let mut handed = self.handed.0.lock();
                if !handed.is_empty() {
                    busy = true;
                    self.streams.extend(handed.drain(..));
                }
            }
            // A stream that answers but goes on (a server stream) wakes this
            // task through the connection, so it is not lost when it does
            // not finish here.
            while let Poll::Ready(Some(())) = self.streams.poll_next_unpin(cx) {
                busy = true;
            }
            if !busy {
                return Poll::Pending;
            }
        }
        cx.waker().wake_by_ref();
        Poll::Pending
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    use std::task::{Wake, Waker};

    use hyper::rt::Executor;

    use super::*;

    struct CountWakes(AtomicUsize);

    impl Wake for CountWakes {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    /// Drives `running` once with `connection`, with a waker that counts
    /// its wakes: the outcome and how often the task woke itself.
    fn drive_once<T>(
        running: &mut Running,
        connection: impl FnMut(&mut Context<'_>) -> Poll<T>,
    ) -> (Poll<T>, usize) {
        let wakes = Arc::new(CountWakes(AtomicUsize::new(0)));
        let waker = Waker::from(wakes.clone());
        let outcome = running.drive(&mut Context::from_waker(&waker), connection);
        (outcome, wakes.0.load(Ordering::SeqCst))
    }

    #[test]
    fn streams_run_in_the_connections_poll_and_their_answers_go_out_in_it() {
        let mut running = Running::default();
        let executor = running.executor();
        let answered = Arc::new(AtomicBool::new(false));
        let mut polls = 0;
        // The connection accepts a stream on its first poll, and is done
        // once it sees that stream's answer.
        let (outcome, wakes) = drive_once(&mut running, |_| {
            polls += 1;
            if answered.load(Ordering::SeqCst) {
                return Poll::Ready("written");
            }
            if polls == 1 {
                let answered = answered.clone();
                executor.execute(async move { answered.store(true, Ordering::SeqCst) });
            }
            Poll::Pending
        });
        assert_eq!(outcome, Poll::Ready("written"));
        assert_eq!(polls, 2, "one poll to accept, one to write the answer");
        assert_eq!(wakes, 0);
    }

    #[test]
    fn a_connection_that_never_rests_yields_its_thread() {
        let mut running = Running::default();
        let executor = running.executor();
        let mut polls = 0;
        let (outcome, wakes) = drive_once(&mut running, |_| -> Poll<()> {
            polls += 1;
            executor.execute(async {});
            Poll::Pending
        });
        assert_eq!(outcome, Poll::Pending);
        assert_eq!(polls, TURNS);
        assert_eq!(wakes, 1, "woken to go on later");
    }

    #[test]
    fn an_idle_connection_waits_without_waking_itself() {
        let mut running = Running::default();
        let mut polls = 0;
        let (outcome, wakes) = drive_once(&mut running, |_| -> Poll<()> {
            polls += 1;
            Poll::Pending
        });
        assert_eq!((outcome, polls, wakes), (Poll::Pending, 1, 0));
    }
}
