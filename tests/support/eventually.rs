//! Waiting for what happens on its own (a process starting, a reload, a
//! metric, a replica catching up): poll a condition until it holds. One
//! generous deadline, [`PATIENCE`], bounds only a failing test; a passing one
//! goes on as soon as the condition holds, so nothing here waits for time.

use std::fmt::Display;
use std::time::{Duration, Instant};

/// How long a condition may take to hold before the test fails.
pub const PATIENCE: Duration = Duration::from_secs(60);

/// The pause between two polls.
const PAUSE: Duration = Duration::from_millis(10);

/// What one poll gives: ready (with its value), or not yet (with what was
/// seen, for the failure message).
pub trait Polled {
    type Value;
    fn ready(self) -> Result<Self::Value, String>;
}

impl Polled for bool {
    type Value = ();
    fn ready(self) -> Result<(), String> {
        if self { Ok(()) } else { Err(String::new()) }
    }
}

impl<T> Polled for Option<T> {
    type Value = T;
    fn ready(self) -> Result<T, String> {
        self.ok_or_else(String::new)
    }
}

impl<T, E: Display> Polled for Result<T, E> {
    type Value = T;
    fn ready(self) -> Result<T, String> {
        self.map_err(|e| e.to_string())
    }
}

/// Polls `check` on this thread until it is ready and returns its value;
/// panics after [`PATIENCE`], naming `what` was awaited and the last thing
/// seen (an `Err`'s text).
#[track_caller]
pub fn eventually<P: Polled>(what: &str, mut check: impl FnMut() -> P) -> P::Value {
    let deadline = Instant::now() + PATIENCE;
    loop {
        match check().ready() {
            Ok(value) => return value,
            Err(last) => gave_up_after(deadline, what, &last),
        }
        std::thread::sleep(PAUSE);
    }
}

/// [`eventually`] for async code: between polls it sleeps on the runtime,
/// so the tasks the condition waits for go on running.
pub async fn eventually_async<P: Polled>(
    what: &str,
    mut check: impl AsyncFnMut() -> P,
) -> P::Value {
    let deadline = Instant::now() + PATIENCE;
    loop {
        match check().await.ready() {
            Ok(value) => return value,
            Err(last) => gave_up_after(deadline, what, &last),
        }
        tokio::time::sleep(PAUSE).await;
    }
}

/// Panics once `deadline` has passed.
#[track_caller]
fn gave_up_after(deadline: Instant, what: &str, last: &str) {
    if Instant::now() >= deadline {
        if last.is_empty() {
            panic!("waited {PATIENCE:?} for {what}");
        }
        panic!("waited {PATIENCE:?} for {what}; last seen: {last}");
    }
}
