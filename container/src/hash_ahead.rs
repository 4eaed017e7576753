//! Large parts hashed whole on a helper thread while the writer writes
//! them.
//!
//! A new large part's digest is needed only once the part is written (the
//! manifest goes last), and the write is a copy into the page cache, which
//! runs at a fraction of the hash's speed. So on a second core the hash of
//! part k overlaps the write of part k, and a `.zt` write costs about what
//! the same bytes written without a digest cost.
//!
//! Hand-offs are per part, never per chunk: the scout once handed every
//! 256 KiB chunk to another thread, and on two busy cores the threads took
//! turns, a wake-up and often a context switch per chunk (see
//! [`crate::scout`]). Here the helper walks the parts in order with no
//! hand-off inside a part. The writer writes a part whole, then asks for
//! its digest: it waits only for a part the helper is hashing (running or
//! runnable work); a part the helper has not started by then (its core is
//! busy elsewhere) the writer claims and hashes itself, as it would have
//! without a helper.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering};
use std::thread::Thread;

use crate::prehash::{DONE, FREE, TAKEN};
use crate::xxh3::{xxh3_64, Xxh3};

/// Below this many bytes to hash, starting a helper thread costs more
/// than it saves (here: the large parts together; the incremental writer
/// asks it of one part).
pub(crate) const WORTH_A_THREAD: usize = 8 << 20;

/// The helper checks whether to stop after each piece of this size.
const PIECE: usize = 8 << 20;

/// What the writer and the helper share, one slot per large part.
struct Shared {
    state: Vec<AtomicU8>,
    /// Valid for a DONE slot.
    digests: Vec<AtomicU64>,
    /// The writer is finished (or gave up): the helper stops.
    stop: AtomicBool,
    /// The writer's thread, unparked each time a slot is DONE.
    writer: Thread,
}

impl Shared {
    fn new(n: usize, writer: Thread) -> Shared {
        Shared {
            state: (0..n).map(|_| AtomicU8::new(FREE)).collect(),
            digests: (0..n).map(|_| AtomicU64::new(0)).collect(),
            stop: AtomicBool::new(false),
            writer,
        }
    }

    /// The helper's loop: claim each slot in turn (skipping those the
    /// writer took), hash it and publish the digest.
    fn help(&self, bytes: &[&[u8]]) {
        for (k, data) in bytes.iter().enumerate() {
            if self.stop.load(Ordering::Relaxed) {
                return;
            }
            if self.state[k]
                .compare_exchange(FREE, TAKEN, Ordering::Relaxed, Ordering::Relaxed)
                .is_err()
            {
                continue;
            }
            let mut hasher = Xxh3::new();
            for piece in data.chunks(PIECE) {
                if self.stop.load(Ordering::Relaxed) {
                    // The writer has stopped; it waits for nothing.
                    return;
                }
                hasher.update(piece);
            }
            self.digests[k].store(hasher.digest(), Ordering::Relaxed);
            self.state[k].store(DONE, Ordering::Release);
            self.writer.unpark();
        }
    }
}

/// The writer's side: the large parts, asked for in order.
pub(crate) struct Large<'s> {
    shared: Option<&'s Shared>,
}

impl Large<'_> {
    /// Whether a helper hashes the large parts: then write each part
    /// whole before asking for its [`Large::digest`]; else hash it on this
    /// thread as it is written.
    pub(crate) fn helped(&self) -> bool {
        self.shared.is_some()
    }

    /// The digest of large part `k` (its position among the large parts),
    /// whose bytes are `data`: the helper's, waiting while it is still
    /// hashing it; a part the helper has not started is claimed and hashed
    /// on this thread.
    pub(crate) fn digest(&self, k: usize, data: &[u8]) -> u64 {
        let Some(shared) = self.shared else {
            return xxh3_64(data);
        };
        let claimed =
            shared.state[k].compare_exchange(FREE, TAKEN, Ordering::Acquire, Ordering::Acquire);
        if claimed.is_ok() {
            return xxh3_64(data);
        }
        while shared.state[k].load(Ordering::Acquire) != DONE {
            // The helper unparks us after every part it finishes; a token
            // left from an earlier one makes this return at once, and the
            // loop looks again.
            std::thread::park();
        }
        shared.digests[k].load(Ordering::Relaxed)
    }
}

/// Run `body` with the large parts `bytes` (in the order the writer will
/// reach them) hashed ahead on a helper thread when they are worth one and
/// there is a second core; else [`Large::helped`] is false and every
/// digest is hashed by the writer.
pub(crate) fn with_large<R>(bytes: &[&[u8]], body: impl FnOnce(&Large<'_>) -> R) -> R {
    let total: usize = bytes.iter().map(|b| b.len()).sum();
    let cores = std::thread::available_parallelism().map_or(1, |c| c.get());
    if total < WORTH_A_THREAD || cores < 2 {
        return body(&Large { shared: None });
    }
    let shared = Shared::new(bytes.len(), std::thread::current());
    let shared = &shared;
    std::thread::scope(|scope| {
        scope.spawn(move || shared.help(bytes));
        // Stops the helper when the body ends, by return or by panic (the
        // scope joins the helper before either goes on).
        let _stop = Stop(shared);
        body(&Large {
            shared: Some(shared),
        })
    })
}

/// Stops the helper when dropped.
struct Stop<'s>(&'s Shared);

impl Drop for Stop<'_> {
    fn drop(&mut self) {
        self.0.stop.store(true, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::xxh3::tests::noise;

    fn parts() -> Vec<Vec<u8>> {
        (0..6u64)
            .map(|i| noise((3 << 20) + i as usize * 4099, i))
            .collect()
    }

    #[test]
    fn helper_digests_match_one_shot_hashes() {
        let p = parts();
        let bytes: Vec<&[u8]> = p.iter().map(|v| &v[..]).collect();
        // The helper's loop run to the end first: every part is its.
        let shared = Shared::new(bytes.len(), std::thread::current());
        shared.help(&bytes);
        let large = Large {
            shared: Some(&shared),
        };
        for (k, data) in bytes.iter().enumerate() {
            assert_eq!(large.digest(k, data), xxh3_64(data), "part {k}");
        }
    }

    #[test]
    fn parts_the_writer_claims_are_skipped_by_the_helper() {
        let p = parts();
        let bytes: Vec<&[u8]> = p.iter().map(|v| &v[..]).collect();
        let shared = Shared::new(bytes.len(), std::thread::current());
        let large = Large {
            shared: Some(&shared),
        };
        // Asked before the helper ran: the writer hashes them itself.
        assert_eq!(large.digest(0, bytes[0]), xxh3_64(bytes[0]));
        assert_eq!(large.digest(3, bytes[3]), xxh3_64(bytes[3]));
        shared.help(&bytes);
        assert_eq!(shared.state[0].load(Ordering::Relaxed), TAKEN);
        assert_eq!(shared.state[3].load(Ordering::Relaxed), TAKEN);
        for k in [1, 2, 4, 5] {
            assert_eq!(shared.state[k].load(Ordering::Relaxed), DONE, "part {k}");
            assert_eq!(large.digest(k, bytes[k]), xxh3_64(bytes[k]), "part {k}");
        }
    }

    #[test]
    fn digests_with_the_thread_match_whoever_hashes() {
        let p = parts();
        let bytes: Vec<&[u8]> = p.iter().map(|v| &v[..]).collect();
        let got: Vec<u64> = with_large(&bytes, |large| {
            (0..bytes.len())
                .map(|k| large.digest(k, bytes[k]))
                .collect()
        });
        let want: Vec<u64> = bytes.iter().map(|b| xxh3_64(b)).collect();
        assert_eq!(got, want);
    }

    #[test]
    fn a_writer_that_stops_early_or_panics_ends_the_helper() {
        let p = parts();
        let bytes: Vec<&[u8]> = p.iter().map(|v| &v[..]).collect();
        // The scope joins the helper: these return only if it stopped.
        let first = with_large(&bytes, |large| large.digest(0, bytes[0]));
        assert_eq!(first, xxh3_64(bytes[0]));
        let r = std::panic::catch_unwind(|| {
            with_large(&bytes, |_| -> () { panic!("the writer failed") })
        });
        assert!(r.is_err());
    }
}
