//! The fetching service every remote read goes through: requests wait on
//! the network on the async runtime, not on threads, and how many are in
//! flight is set by a [`Budget`] of requests and bytes, independent of the
//! CPU count.
//!
//! Every ranged GET of a [`crate::RemoteObject`] (whole-model and tensor
//! loads through the core's remote store, record-store gathers, structure
//! walks) is admitted by the budget of its configuration
//! (`inflight_requests`, `inflight_bytes`; defaults
//! [`crate::config::DEFAULT_INFLIGHT_REQUESTS`] and
//! [`crate::config::DEFAULT_INFLIGHT_BYTES`]) before it is sent and holds
//! its admission until its body is in. One budget serves the whole process
//! (per configuration), so a gather over many shards, several DataLoader
//! steps fetched ahead and a model load together never exceed it, and a
//! caller that blocks one thread on a gather still has every request of
//! that gather in flight.
//!
//! A caller that wants the bytes later hands the work to [`spawn`] and
//! keeps the [`Pending`] handle: the requests run on the runtime while the
//! caller's thread does other work (the DataLoader fetching future steps'
//! records while the current step is decoded). Decompression and copying
//! stay with the caller, on its CPU pool.

use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use tokio::sync::{Semaphore, SemaphorePermit};
use tokio::task::JoinHandle;

use crate::config::RemoteConfig;
use crate::error::{Error, ErrorKind, Result};
use crate::object::RemoteObject;
use crate::runtime::{block_on, runtime};

/// The byte budget is counted in units of this many bytes (a semaphore
/// counts in `u32` permits).
const UNIT: u64 = 4 << 10;

/// Requests and bytes in flight, bounded.
#[derive(Debug)]
pub struct Budget {
    requests: Semaphore,
    bytes: Semaphore,
    units: u32,
    in_flight: AtomicUsize,
    peak: AtomicUsize,
}

/// One request's admission: released when dropped.
#[derive(Debug)]
pub struct Admitted<'a> {
    budget: &'a Budget,
    _request: SemaphorePermit<'a>,
    _bytes: SemaphorePermit<'a>,
}

impl Drop for Admitted<'_> {
    fn drop(&mut self) {
        self.budget.in_flight.fetch_sub(1, Ordering::Relaxed);
    }
}

impl Budget {
    /// A budget of `requests` requests and `bytes` bytes in flight.
    pub fn new(requests: usize, bytes: u64) -> Budget {
        let requests = requests.clamp(1, Semaphore::MAX_PERMITS);
        let units = (bytes / UNIT).clamp(1, u64::from(u32::MAX)) as u32;
        Budget {
            requests: Semaphore::new(requests),
            bytes: Semaphore::new(units as usize),
            units,
            in_flight: AtomicUsize::new(0),
            peak: AtomicUsize::new(0),
        }
    }

    /// Wait until a request of `len` bytes fits: one request and its bytes
    /// (a request larger than the whole byte budget waits for all of it, so
    /// it still runs, alone).
    pub async fn admit(&self, len: u64) -> Admitted<'_> {
        // Requests first, then bytes: every caller takes them in this
        // order, so no two wait on each other.
        let request = self
            .requests
            .acquire()
            .await
            .expect("the budget's semaphores are never closed");
        let units = len.div_ceil(UNIT).clamp(1, u64::from(self.units)) as u32;
        let bytes = self
            .bytes
            .acquire_many(units)
            .await
            .expect("the budget's semaphores are never closed");
        let now = self.in_flight.fetch_add(1, Ordering::Relaxed) + 1;
        self.peak.fetch_max(now, Ordering::Relaxed);
        Admitted {
            budget: self,
            _request: request,
            _bytes: bytes,
        }
    }

    /// Requests admitted and not yet finished.
    pub fn in_flight(&self) -> usize {
        self.in_flight.load(Ordering::Relaxed)
    }

    /// The most requests ever in flight together under this budget.
    pub fn peak(&self) -> usize {
        self.peak.load(Ordering::Relaxed)
    }
}

/// The process's budget for `config` (one per pair of limits, so objects
/// opened with the same options share one; rebuilt in a forked child,
/// whose parent's admissions belong to tasks that do not exist there).
pub fn budget_for(config: &RemoteConfig) -> Arc<Budget> {
    type Budgets = (u32, HashMap<(usize, u64), Arc<Budget>>);
    static BUDGETS: OnceLock<Mutex<Budgets>> = OnceLock::new();
    let mut guard = BUDGETS
        .get_or_init(|| Mutex::new((0, HashMap::new())))
        .lock()
        .unwrap_or_else(|p| p.into_inner());
    let pid = std::process::id();
    if guard.0 != pid {
        *guard = (pid, HashMap::new());
    }
    let key = (config.inflight_requests, config.inflight_bytes);
    Arc::clone(
        guard
            .1
            .entry(key)
            .or_insert_with(|| Arc::new(Budget::new(key.0, key.1))),
    )
}

/// Work running on the runtime, its result collected by [`Pending::wait`].
/// Dropping it unwaited cancels the work (its requests are abandoned and
/// their admissions returned).
#[derive(Debug)]
pub struct Pending<T> {
    handle: Option<JoinHandle<T>>,
}

impl<T> Pending<T> {
    /// Block this thread until the work is done; its result.
    pub fn wait(mut self) -> Result<T> {
        let handle = self.handle.take().expect("waited once");
        block_on(handle)?.map_err(|e| {
            Error::new(
                ErrorKind::Io,
                "the object-storage runtime",
                format!("a fetch did not finish: {e}"),
            )
        })
    }

    /// True once the work is done (waiting will not block).
    pub fn is_finished(&self) -> bool {
        self.handle.as_ref().is_none_or(JoinHandle::is_finished)
    }
}

impl<T> Drop for Pending<T> {
    fn drop(&mut self) {
        if let Some(handle) = self.handle.take() {
            handle.abort();
        }
    }
}

/// One object and ranges of it (`(offset, len)` each).
pub type ObjectRanges = (Arc<RemoteObject>, Vec<(u64, u64)>);

/// The ranges of several objects (`(object, ranges)` each, planned per
/// object as [`RemoteObject::read_ranges`] plans them), fetched together:
/// every object's requests in flight at once, as many as the budget
/// admits. The bytes come back per object, per range, in order.
pub async fn ranges_of(jobs: Vec<ObjectRanges>) -> Result<Vec<Vec<Vec<u8>>>> {
    futures::future::try_join_all(
        jobs.iter()
            .map(|(object, ranges)| object.fetch_ranges(ranges)),
    )
    .await
}

/// Start `work` on the runtime now; its result comes from the handle.
pub fn spawn<F>(work: F) -> Result<Pending<F::Output>>
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    Ok(Pending {
        handle: Some(runtime()?.spawn(work)),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    /// Many requests offered at once: the budget keeps exactly its count in
    /// flight (never more, and all of it while there is work).
    #[test]
    fn the_budget_bounds_requests_in_flight() {
        let budget = Arc::new(Budget::new(8, 1 << 30));
        let tasks: Vec<_> = (0..64)
            .map(|_| {
                let budget = Arc::clone(&budget);
                spawn(async move {
                    let _admitted = budget.admit(4096).await;
                    let now = budget.in_flight();
                    tokio::time::sleep(Duration::from_millis(5)).await;
                    now
                })
                .unwrap()
            })
            .collect();
        let seen: Vec<usize> = tasks.into_iter().map(|t| t.wait().unwrap()).collect();
        assert!(seen.iter().all(|&n| n <= 8), "{seen:?}");
        assert_eq!(budget.peak(), 8);
        assert_eq!(budget.in_flight(), 0);
    }

    /// The byte budget: 1 MiB in flight admits four 256 KiB requests at a
    /// time, and a request past the whole budget still runs (alone).
    #[test]
    fn the_byte_budget_bounds_bytes_in_flight() {
        let budget = Arc::new(Budget::new(100, 1 << 20));
        let tasks: Vec<_> = (0..16)
            .map(|i| {
                let budget = Arc::clone(&budget);
                let len = if i == 7 { 8 << 20 } else { 256 << 10 };
                spawn(async move {
                    let _admitted = budget.admit(len).await;
                    let now = budget.in_flight();
                    tokio::time::sleep(Duration::from_millis(5)).await;
                    (len, now)
                })
                .unwrap()
            })
            .collect();
        for t in tasks {
            let (len, now) = t.wait().unwrap();
            assert!(now <= 4, "{now} in flight");
            if len > 1 << 20 {
                assert_eq!(now, 1, "the oversized request ran beside others");
            }
        }
        assert_eq!(budget.peak(), 4);
    }

    #[test]
    fn one_budget_per_configuration_and_dropping_a_pending_cancels_it() {
        let a = budget_for(&RemoteConfig::default());
        let b = budget_for(&RemoteConfig::default());
        assert!(Arc::ptr_eq(&a, &b));
        let other = RemoteConfig {
            inflight_requests: 3,
            ..RemoteConfig::default()
        };
        assert!(!Arc::ptr_eq(&a, &budget_for(&other)));

        let budget = Arc::new(Budget::new(1, 1 << 20));
        let held = Arc::clone(&budget);
        let pending = spawn(async move {
            let _admitted = held.admit(1).await;
            tokio::time::sleep(Duration::from_secs(3600)).await;
        })
        .unwrap();
        while budget.in_flight() == 0 {
            std::thread::yield_now();
        }
        drop(pending);
        // The cancelled task's admission comes back: another is admitted.
        let again = Arc::clone(&budget);
        spawn(async move { drop(again.admit(1).await) })
            .unwrap()
            .wait()
            .unwrap();
    }
}
