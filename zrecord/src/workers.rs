//! The writer's parallel loop: jobs handed out in order to the CPU pool's
//! threads and to the calling thread.
//!
//! A rayon parallel iterator started from a thread outside the pool (the
//! Python thread of an `append`) parks the caller until the pool is done, so
//! an append ran on the pool's threads only. Here the caller takes jobs too,
//! as loaderx's append does: on an idle machine that changes little, while
//! on shared cores a runnable caller keeps its share of the CPU instead of
//! sleeping through the append. Jobs are handed out one at a time from a
//! counter, so the window ends when the last job does, not when the slowest
//! of the halves a parallel iterator splits it into does.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Mutex;

use crate::error::{Error, Result};

/// Run `job(i)` for every `i` in `0..n`, starting them in increasing order
/// on the rayon pool's threads and the calling thread. The first error stops
/// the hand-out (jobs already started finish) and is returned.
pub(crate) fn run<F>(n: usize, job: F) -> Result<()>
where
    F: Fn(usize) -> Result<()> + Sync,
{
    let next = AtomicUsize::new(0);
    let stop = AtomicBool::new(false);
    let failed: Mutex<Option<Error>> = Mutex::new(None);
    let work = || {
        while !stop.load(Ordering::Relaxed) {
            let i = next.fetch_add(1, Ordering::Relaxed);
            if i >= n {
                break;
            }
            if let Err(e) = job(i) {
                stop.store(true, Ordering::Relaxed);
                failed
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .get_or_insert(e);
                break;
            }
        }
    };
    // One job needs no helper: the caller runs it without waking the pool.
    let helpers = rayon::current_num_threads().min(n.saturating_sub(1));
    let work = &work;
    rayon::in_place_scope(|s| {
        for _ in 0..helpers {
            s.spawn(move |_| work());
        }
        work();
    });
    match failed.into_inner().unwrap_or_else(|p| p.into_inner()) {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicU64;

    #[test]
    fn every_job_runs_once() {
        let seen: Vec<AtomicU64> = (0..1000).map(|_| AtomicU64::new(0)).collect();
        run(seen.len(), |i| {
            seen[i].fetch_add(1, Ordering::Relaxed);
            Ok(())
        })
        .unwrap();
        assert!(seen.iter().all(|s| s.load(Ordering::Relaxed) == 1));
        run(0, |_| panic!("no job to run")).unwrap();
    }

    #[test]
    fn an_error_stops_the_hand_out() {
        // Every job fails: a thread stops at its first failure, so at most
        // one job per thread (the pool's and the caller) ever runs.
        let ran = AtomicUsize::new(0);
        let err = run(10_000, |i| {
            ran.fetch_add(1, Ordering::Relaxed);
            Err(Error::invalid(format!("job {i} failed")))
        })
        .unwrap_err();
        assert!(err.to_string().contains("failed"), "{err}");
        assert!(ran.load(Ordering::Relaxed) <= rayon::current_num_threads() + 1);
    }

    #[test]
    fn the_caller_takes_jobs_too() {
        // The pool's threads hold their jobs until the caller has run one:
        // this returns only if the caller works.
        let caller = std::thread::current().id();
        let by_caller = AtomicUsize::new(0);
        run(64, |_| {
            if std::thread::current().id() == caller {
                by_caller.fetch_add(1, Ordering::Relaxed);
            } else {
                while by_caller.load(Ordering::Relaxed) == 0 {
                    std::thread::yield_now();
                }
            }
            Ok(())
        })
        .unwrap();
        assert!(by_caller.load(Ordering::Relaxed) > 0);
    }
}
