//! Gathers of a source read by byte ranges of objects in object storage
//! (a Megatron `.bin`, [`crate::binidx`]; MDS shards, [`crate::mds`]): each gather's ranges go through
//! zt-remote's fetch path (planned per object: large ranges split, close
//! neighbours coalesced; every request admitted by the process-wide budget
//! and sent on the remote runtime), and a gather its caller knows in
//! advance (the DataLoader's prefetch window) can be started early and
//! taken later by the gather of exactly those indices, as a store's
//! gathers are ([`crate::remote::Objects`]).

use std::collections::VecDeque;
use std::path::Path;
use std::sync::Mutex;

use zt_remote::fetch::{ranges_of, ObjectRanges, Pending};

use crate::error::Result;

/// Gathers started ahead and kept for their gather; past this the oldest
/// is cancelled (a gather that never came, after a seek).
const AHEAD_SLOTS: usize = 64;
/// The most bytes the gathers started ahead may hold together (the
/// DataLoader's default `prefetch_bytes`); past it the oldest are
/// cancelled.
const AHEAD_BYTES: u64 = 1 << 30;

/// Each object's bytes per range, as [`ranges_of`] returns them.
pub(crate) type Fetched = Vec<Vec<Vec<u8>>>;

/// One gather's ranges requested early.
struct Started {
    idxs: Vec<u64>,
    bytes: u64,
    fetched: Pending<zt_remote::Result<Fetched>>,
}

/// The gathers of one source started ahead, oldest first.
#[derive(Default)]
pub(crate) struct Ranged {
    ahead: Mutex<VecDeque<Started>>,
}

fn total(jobs: &[ObjectRanges]) -> u64 {
    jobs.iter()
        .flat_map(|(_, ranges)| ranges.iter().map(|r| r.1))
        .sum()
}

impl Ranged {
    /// Start fetching `jobs`, the ranges of a gather of `idxs`, now (the
    /// oldest started gathers are cancelled past [`AHEAD_SLOTS`] or
    /// [`AHEAD_BYTES`]).
    pub(crate) fn start(&self, path: &Path, idxs: &[u64], jobs: Vec<ObjectRanges>) -> Result<()> {
        let bytes = total(&jobs);
        let fetched =
            zt_remote::fetch::spawn(ranges_of(jobs)).map_err(|e| crate::remote::error(path, e))?;
        let mut ahead = self.ahead.lock().unwrap_or_else(|p| p.into_inner());
        let held = |a: &VecDeque<Started>| a.iter().map(|s| s.bytes).sum::<u64>();
        while !ahead.is_empty()
            && (ahead.len() >= AHEAD_SLOTS || held(&ahead) + bytes > AHEAD_BYTES)
        {
            ahead.pop_front();
        }
        ahead.push_back(Started {
            idxs: idxs.to_vec(),
            bytes,
            fetched,
        });
        Ok(())
    }

    /// The bytes of a gather of `idxs`: those started ahead for exactly
    /// these indices (whose ranges were `jobs()`'s then: a source's ranges
    /// for given indices never change), else `jobs()` fetched now, every
    /// object's requests in flight together.
    pub(crate) fn fetch(
        &self,
        path: &Path,
        idxs: &[u64],
        jobs: impl FnOnce() -> Vec<ObjectRanges>,
    ) -> Result<Fetched> {
        let started = {
            let mut ahead = self.ahead.lock().unwrap_or_else(|p| p.into_inner());
            let at = ahead.iter().position(|s| s.idxs == idxs);
            at.and_then(|at| ahead.remove(at))
        };
        let fetched = match started {
            Some(s) => s.fetched.wait(),
            None => zt_remote::runtime::block_on(ranges_of(jobs())),
        };
        fetched
            .and_then(|r| r)
            .map_err(|e| crate::remote::error(path, e))
    }
}
