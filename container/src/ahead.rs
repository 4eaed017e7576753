//! Work on every part done by worker threads, handed to one consuming thread
//! in part order as each result arrives.
//!
//! The batch writer needs a part's digest before it can place the part (a
//! byte-identical earlier part is shared, not written), so the digests
//! cannot trail the write. Computing all of them first and writing after
//! costs a whole extra pass over the bytes in wall time; here the workers
//! run ahead while the writer writes whatever is ready, so on two or more
//! cores the hashing (and compression) hides behind the write.

use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Condvar, Mutex, PoisonError};
use zt_core::Rule;

use rayon::prelude::*;

use zt_core::error::{Context, Error, Result};

struct Shared<T> {
    state: Mutex<State<T>>,
    ready: Condvar,
    /// Set when the consumer is done (or gave up): workers skip what is left.
    stop: AtomicBool,
}

struct State<T> {
    slots: Vec<Option<Result<T>>>,
    /// The index the consumer sleeps on, so only its producer wakes it
    /// (a wake-up per part would cost a syscall per small tensor).
    waiting_for: Option<usize>,
}

/// The consumer's side: results taken in index order, waiting for each.
pub(crate) struct InOrder<'a, T> {
    shared: &'a Shared<T>,
}

impl<T> InOrder<'_, T> {
    /// The result for index `i`, blocking until a worker has produced it.
    /// Each index is taken once; taking one twice panics (a caller bug).
    pub(crate) fn take(&mut self, i: usize) -> Result<T> {
        let mut state = self
            .shared
            .state
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        loop {
            if let Some(r) = state.slots[i].take() {
                state.waiting_for = None;
                return r;
            }
            state.waiting_for = Some(i);
            state = self
                .shared
                .ready
                .wait(state)
                .unwrap_or_else(PoisonError::into_inner);
        }
    }
}

fn shared_with<T>(slots: Vec<Option<Result<T>>>) -> Shared<T> {
    Shared {
        state: Mutex::new(State {
            slots,
            waiting_for: None,
        }),
        ready: Condvar::new(),
        stop: AtomicBool::new(false),
    }
}

/// Run `work(i)` for every `i < n` on the rayon pool while `consume` runs on
/// the calling thread and takes the results in order. Returns what
/// `consume` returns; work not yet started when it returns is skipped.
pub(crate) fn run_ahead<T, W, C, R>(n: usize, work: W, consume: C) -> R
where
    T: Send,
    W: Fn(usize) -> Result<T> + Sync,
    C: FnOnce(&mut InOrder<'_, T>) -> R,
{
    if rayon::current_thread_index().is_some() {
        // Called from a pool thread: blocking it while waiting for the pool
        // could wait forever (a one-thread pool has nobody else to do the
        // work), so finish the work first and hand it over afterwards.
        let slots = (0..n).into_par_iter().map(|i| Some(work(i))).collect();
        return consume(&mut InOrder {
            shared: &shared_with(slots),
        });
    }
    let shared = shared_with((0..n).map(|_| None).collect());
    std::thread::scope(|scope| {
        scope.spawn(|| {
            // An indexed range is split into halves, so one worker walks the
            // front in order while another starts further on: the consumer,
            // which needs the front first, rarely waits.
            (0..n).into_par_iter().for_each(|i| {
                if shared.stop.load(Ordering::Relaxed) {
                    return;
                }
                // A panicking worker must still fill its slot, or the
                // consumer would wait for it forever.
                let r =
                    std::panic::catch_unwind(AssertUnwindSafe(|| work(i))).unwrap_or_else(|_| {
                        Err(Error::Write {
                            rule: Rule::WRITE_STATE,
                            ctx: Context::default(),
                            reason: format!("a worker panicked on part {i}"),
                        })
                    });
                let mut state = shared.state.lock().unwrap_or_else(PoisonError::into_inner);
                state.slots[i] = Some(r);
                let wake = state.waiting_for == Some(i);
                drop(state);
                if wake {
                    shared.ready.notify_one();
                }
            });
        });
        let out = consume(&mut InOrder { shared: &shared });
        shared.stop.store(true, Ordering::Relaxed);
        out
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn results_arrive_in_order_whatever_the_finishing_order() {
        let got = run_ahead(
            200,
            |i| {
                // Later indices finish first.
                std::thread::sleep(std::time::Duration::from_micros((200 - i as u64) * 5));
                Ok(i * 3)
            },
            |rx| (0..200).map(|i| rx.take(i).unwrap()).collect::<Vec<_>>(),
        );
        assert_eq!(got, (0..200).map(|i| i * 3).collect::<Vec<_>>());
    }

    #[test]
    fn a_call_from_a_pool_thread_works_first_then_hands_over_in_order() {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(1)
            .build()
            .unwrap();
        let got = pool.install(|| {
            run_ahead(
                50,
                |i| Ok(i + 1),
                |rx| (0..50).map(|i| rx.take(i).unwrap()).sum::<usize>(),
            )
        });
        assert_eq!(got, (1..=50).sum::<usize>());
    }

    #[test]
    fn a_panicking_worker_is_an_error_not_a_hang() {
        let got = run_ahead(
            8,
            |i| if i == 5 { panic!("boom") } else { Ok(i) },
            |rx| (0..8).map(|i| rx.take(i)).collect::<Result<Vec<_>>>(),
        );
        assert!(got.unwrap_err().to_string().contains("panicked on part 5"));
    }

    #[test]
    fn a_consumer_that_stops_early_returns_without_waiting_for_the_rest() {
        let err = run_ahead(
            10_000,
            |i| {
                if i == 3 {
                    Err(Error::Write {
                        rule: Rule::WRITE_STATE,
                        ctx: zt_core::error::Context::default(),
                        reason: "part 3".into(),
                    })
                } else {
                    Ok(i)
                }
            },
            |rx| -> Result<()> {
                for i in 0..10_000 {
                    rx.take(i)?;
                }
                Ok(())
            },
        );
        assert!(err.unwrap_err().to_string().contains("part 3"));
    }
}
