//! Small parts hashed on a helper thread a little ahead of the writer.
//!
//! The scout hashes each part on the writing thread just before it is
//! written (issue 39: handing every chunk to another thread made the two
//! take turns). For tens of thousands of small tensors that put the whole
//! hash on the writing thread, where the old scout thread had hashed them
//! on the other core. Here only runs of small parts go to a helper, about
//! [`BATCH`] bytes of them per hand-off, so a hand-off is rare next to the
//! work it carries; large parts stay on the writing thread.
//!
//! The writer never waits for the helper: when it reaches a batch the
//! helper has not finished (the helper was descheduled, or has not
//! started), it claims the batch and hashes its parts itself, as it would
//! without a helper. The helper runs at most [`AHEAD`] batches past the
//! writer, so the bytes it hashed are still in cache when the writer copies
//! them, and parks (no spinning) when it is that far ahead.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, AtomicUsize, Ordering};
use std::thread::Thread;

use crate::xxh3::xxh3_64;

/// Bytes of small parts per batch (one hand-off).
pub(crate) const BATCH: usize = 1 << 20;

/// How many batches the helper may hash past the one the writer is in.
const AHEAD: usize = 2;

/// Below this many batches a helper thread costs more than it saves.
const MIN_BATCHES: usize = 3;

/// A slot's state, for this helper and [`crate::hash_ahead`]'s: no one
/// has it, someone is hashing it, its digests are published.
pub(crate) const FREE: u8 = 0;
pub(crate) const TAKEN: u8 = 1;
pub(crate) const DONE: u8 = 2;

/// What the writer and the helper share.
struct Shared {
    /// Batch `b` holds parts `ends[b - 1]..ends[b]` (from 0 for `b = 0`).
    ends: Vec<usize>,
    /// FREE, TAKEN (someone is hashing it) or DONE (digests published).
    state: Vec<AtomicU8>,
    /// Per part; valid for the small parts of a DONE batch.
    digests: Vec<AtomicU64>,
    /// The batch the writer is in.
    writer_at: AtomicUsize,
    /// The writer is finished (or gave up): the helper stops.
    stop: AtomicBool,
    /// Parts at most this long are small.
    small: usize,
}

impl Shared {
    fn new(lens: impl Iterator<Item = usize>, small: usize) -> Shared {
        let mut ends = Vec::new();
        let (mut n, mut bytes) = (0, 0);
        for len in lens {
            n += 1;
            if len <= small {
                bytes += len;
                if bytes >= BATCH {
                    ends.push(n);
                    bytes = 0;
                }
            }
        }
        if ends.last() != Some(&n) {
            ends.push(n);
        }
        Shared {
            state: ends.iter().map(|_| AtomicU8::new(FREE)).collect(),
            digests: (0..n).map(|_| AtomicU64::new(0)).collect(),
            ends,
            writer_at: AtomicUsize::new(0),
            stop: AtomicBool::new(false),
            small,
        }
    }

    fn parts(&self, b: usize) -> std::ops::Range<usize> {
        (if b == 0 { 0 } else { self.ends[b - 1] })..self.ends[b]
    }

    /// The helper's loop: claim each batch in turn (skipping those the
    /// writer took), hash its small parts and publish them, staying at
    /// most AHEAD batches past the writer.
    fn help<'a>(&self, part: &(dyn Fn(usize) -> &'a [u8] + Sync)) {
        for b in 0..self.ends.len() {
            loop {
                if self.stop.load(Ordering::Relaxed) {
                    return;
                }
                if b <= self.writer_at.load(Ordering::Acquire) + AHEAD {
                    break;
                }
                // The writer unparks us each time it enters a batch; a
                // token left from before makes this return at once.
                std::thread::park();
            }
            if self.state[b]
                .compare_exchange(FREE, TAKEN, Ordering::Relaxed, Ordering::Relaxed)
                .is_err()
            {
                continue;
            }
            for i in self.parts(b) {
                let data = part(i);
                if data.len() <= self.small {
                    self.digests[i].store(xxh3_64(data), Ordering::Relaxed);
                }
            }
            self.state[b].store(DONE, Ordering::Release);
        }
    }
}

/// The writer's side: the digest of each small part, asked in part order.
pub(crate) struct Digests<'s> {
    ahead: Option<(&'s Shared, Thread)>,
    /// The batch the writer is in, and whether the helper hashed it.
    batch: Option<(usize, bool)>,
}

impl Digests<'_> {
    /// XXH3-64 of part `i`, whose bytes are `data` (at most `small` long);
    /// `i` must not decrease from one call to the next.
    pub(crate) fn small(&mut self, i: usize, data: &[u8]) -> u64 {
        let Some((shared, helper)) = &self.ahead else {
            return xxh3_64(data);
        };
        let mut b = self.batch.map_or(0, |(b, _)| b);
        while i >= shared.ends[b] {
            b += 1;
        }
        let hashed = match self.batch {
            Some((at, hashed)) if at == b => hashed,
            _ => {
                // Claim it if the helper has not: then it will not hash it
                // too. Taken but not done, the writer hashes it as well
                // rather than wait.
                let state = shared.state[b].compare_exchange(
                    FREE,
                    TAKEN,
                    Ordering::Acquire,
                    Ordering::Acquire,
                );
                let hashed = state == Err(DONE);
                self.batch = Some((b, hashed));
                shared.writer_at.store(b, Ordering::Release);
                helper.unpark();
                hashed
            }
        };
        if hashed {
            shared.digests[i].load(Ordering::Relaxed)
        } else {
            xxh3_64(data)
        }
    }
}

/// Run `body` with the digests of the small parts among `n` parts
/// (`part(i)` gives part i's bytes; a part is small when at most `small`
/// bytes long), hashed ahead on a helper thread when there are enough of
/// them and a second core, else on the calling thread as asked.
pub(crate) fn with_digests<'a, P, R>(
    n: usize,
    part: &P,
    small: usize,
    body: impl FnOnce(&mut Digests<'_>) -> R,
) -> R
where
    P: Fn(usize) -> &'a [u8] + Sync,
{
    let shared = Shared::new((0..n).map(|i| part(i).len()), small);
    let cores = std::thread::available_parallelism().map_or(1, |c| c.get());
    if shared.ends.len() < MIN_BATCHES || cores < 2 {
        return body(&mut Digests {
            ahead: None,
            batch: None,
        });
    }
    let shared = &shared;
    std::thread::scope(|scope| {
        let helper = scope.spawn(move || shared.help(part));
        let mut digests = Digests {
            ahead: Some((shared, helper.thread().clone())),
            batch: None,
        };
        // Stops the helper when the body ends, by return or by panic (the
        // scope joins the helper, which a parked helper would never let).
        let _stop = Stop(shared, helper.thread().clone());
        body(&mut digests)
    })
}

/// Stops the helper when dropped.
struct Stop<'s>(&'s Shared, Thread);

impl Drop for Stop<'_> {
    fn drop(&mut self) {
        self.0.stop.store(true, Ordering::Relaxed);
        self.1.unpark();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::xxh3::tests::noise;

    /// Small parts of several sizes (empty ones too) with large ones among
    /// them, about 5 batches of small bytes.
    fn parts() -> Vec<Vec<u8>> {
        (0..600u64)
            .map(|i| match i % 50 {
                7 => noise(300_000, i),
                9 => Vec::new(),
                _ => noise(5000 + (i as usize * 37) % 9000, i),
            })
            .collect()
    }

    const SMALL: usize = 256 << 10;

    #[test]
    fn batches_cover_every_part_once() {
        let p = parts();
        let shared = Shared::new(p.iter().map(Vec::len), SMALL);
        assert!(shared.ends.len() >= MIN_BATCHES);
        let mut next = 0;
        for b in 0..shared.ends.len() {
            let r = shared.parts(b);
            assert_eq!(r.start, next);
            assert!(!r.is_empty());
            next = r.end;
        }
        assert_eq!(next, p.len());
    }

    #[test]
    fn digests_from_the_helper_match_one_shot_hashes() {
        let p = parts();
        let part = |i: usize| &p[i][..];
        // The helper's loop run to the end first (nothing holds it back),
        // so every batch is the helper's.
        let shared = Shared::new(p.iter().map(Vec::len), SMALL);
        shared.writer_at.store(usize::MAX / 2, Ordering::Relaxed);
        shared.help(&part);
        assert!(shared
            .state
            .iter()
            .all(|s| s.load(Ordering::Relaxed) == DONE));
        shared.writer_at.store(0, Ordering::Relaxed);
        let mut d = Digests {
            ahead: Some((&shared, std::thread::current())),
            batch: None,
        };
        for (i, data) in p.iter().enumerate() {
            if data.len() <= SMALL {
                assert_eq!(d.small(i, data), xxh3_64(data), "part {i}");
                assert!(d.batch.unwrap().1, "part {i} hashed by the helper");
            }
        }
    }

    #[test]
    fn digests_with_the_thread_match_one_shot_hashes() {
        let p = parts();
        let part = |i: usize| &p[i][..];
        let got: Vec<Option<u64>> = with_digests(p.len(), &part, SMALL, |d| {
            (0..p.len())
                .map(|i| (p[i].len() <= SMALL).then(|| d.small(i, &p[i])))
                .collect()
        });
        for (i, data) in p.iter().enumerate() {
            let want = (data.len() <= SMALL).then(|| xxh3_64(data));
            assert_eq!(got[i], want, "part {i}");
        }
    }

    #[test]
    fn a_writer_that_panics_ends_the_helper() {
        let p = parts();
        let part = |i: usize| &p[i][..];
        // The scope joins the helper before the panic goes on: this
        // returns only if the helper stopped.
        let r = std::panic::catch_unwind(|| {
            with_digests(p.len(), &part, SMALL, |d| {
                d.small(0, &p[0]);
                panic!("the writer failed")
            })
        });
        assert!(r.is_err());
    }

    #[test]
    fn a_writer_that_stops_early_ends_the_helper() {
        let p = parts();
        let part = |i: usize| &p[i][..];
        // The scope joins the helper: this returns only if it stopped.
        let first = with_digests(p.len(), &part, SMALL, |d| d.small(0, &p[0]));
        assert_eq!(first, xxh3_64(&p[0]));
    }
}
