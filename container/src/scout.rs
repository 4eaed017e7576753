//! The hashing side of the uncompressed batch writer, on the writing
//! thread: it walks the parts in order, decides which parts repeat an
//! earlier one, and hashes the rest in chunks just before they are
//! written, so the write copies bytes the hash has just pulled into the
//! CPU cache and each byte is read from memory once.
//!
//! It ran on a thread of its own a few chunks ahead of the writer until
//! issue 39: on a machine whose two cores were busy the threads took turns
//! (the writer woke the scout for every 256 KiB chunk, and the woken
//! thread often took the writer's core), so the hash still added its whole
//! time to the write, plus a context switch per chunk. On one thread the
//! same order (hash a chunk, write it) costs the hash alone; the hash runs
//! at the CPU's vector width ([`crate::xxh3`]).
//!
//! Runs of small parts are the exception: a helper thread hashes them in
//! batches a little ahead of the writer ([`crate::prehash`]), so tens of
//! thousands of small tensors do not put their whole hash on this thread.
//!
//! A large part can only be streamed that way if no earlier part has the
//! same bytes, which is known before it is hashed: an earlier identical
//! part has the same length and the same first bytes. Only a part that
//! matches an earlier one on both is hashed whole first and compared.
//! With a second core those streamed parts are hashed on a helper thread
//! while the writer writes them instead ([`crate::hash_ahead`]: one
//! hand-off per part; a part the helper has not reached by the time it is
//! written the writer hashes itself).

use std::collections::HashSet;
use std::convert::Infallible;
use std::io;

use crate::dedup::{BlobKey, Seen};
use crate::hash_ahead;
use crate::prehash;
use crate::xxh3::{xxh3_64, Xxh3};
use zt_core::catalog::Digest;

/// Parts longer than this are hashed in chunks of this size, each handed
/// to the writer as soon as it is hashed, while it is in cache.
pub(crate) const CHUNK: usize = 256 << 10;

/// The writer writes streamed parts in pieces that end on multiples of this
/// file offset. The page cache gives a buffered write folios no larger than
/// the write, and a reader that maps the file later faults once per folio
/// (at most once per 2 MiB): a `.zt` written in 256 KiB chunks was
/// markedly slower to traverse warm through zero-copy views than a
/// safetensors file written whole; written in 2 MiB pieces, it is as fast.
pub(crate) const WRITE_PIECE: u64 = 2 << 20;

/// How many leading bytes of a large part fingerprint it.
const PREFIX: usize = 4096;

/// A part hashed whole.
#[derive(Debug)]
pub(crate) struct Whole {
    pub part: usize,
    pub digest: Digest,
    /// An earlier part with the same bytes, which this one shares.
    pub twin: Option<usize>,
}

/// What the scout tells the writer, in part order.
#[derive(Debug)]
pub(crate) enum Scouted {
    /// A part hashed whole.
    Whole(Whole),
    /// `part` (a new large part) may be written up to byte `end`: hashed
    /// that far on this thread, or hashed whole by the helper.
    Chunk { part: usize, end: usize },
    /// `part`, streamed, is hashed to its end.
    Streamed { part: usize, digest: Digest },
}

/// Scout `n` parts (`part(i)` gives part i's bytes), handing each message
/// to `consume` as soon as it is known, in part order. The first error
/// `consume` returns ends the walk and is returned.
pub(crate) fn scout<'a, P, C>(n: usize, part: P, mut consume: C) -> io::Result<()>
where
    P: Fn(usize) -> &'a [u8] + Sync,
    C: FnMut(Scouted) -> io::Result<()>,
{
    let streamed = streamed_parts(n, &part);
    let streamed_bytes: Vec<&[u8]> = streamed.iter().map(|&i| part(i)).collect();
    prehash::with_digests(n, &part, CHUNK, |small| {
        hash_ahead::with_large(&streamed_bytes, |large| {
            // The parts written so far, by content.
            let mut written: Seen<usize> = Seen::default();
            let mut next_streamed = 0;
            for i in 0..n {
                let data = part(i);
                if streamed.get(next_streamed) == Some(&i) {
                    // No earlier part can have these bytes: stream it.
                    let k = next_streamed;
                    next_streamed += 1;
                    let digest = if large.helped() {
                        consume(Scouted::Chunk {
                            part: i,
                            end: data.len(),
                        })?;
                        large.digest(k, data)
                    } else {
                        let mut hasher = Xxh3::new();
                        for (c, chunk) in data.chunks(CHUNK).enumerate() {
                            hasher.update(chunk);
                            let end = c * CHUNK + chunk.len();
                            consume(Scouted::Chunk { part: i, end })?;
                        }
                        hasher.digest()
                    };
                    let digest = Digest::Xxh3(digest);
                    let key = BlobKey::new(&digest, data.len() as u64, false);
                    written.record(key, i);
                    consume(Scouted::Streamed { part: i, digest })?;
                    continue;
                }
                let digest = if data.len() <= CHUNK {
                    small.small(i, data)
                } else {
                    xxh3_64(data)
                };
                let key = BlobKey::new(&Digest::Xxh3(digest), data.len() as u64, false);
                // Equality is confirmed on the bytes, not assumed from the digest.
                let same = |j: usize| Ok::<_, Infallible>(part(j) == data);
                let Ok(twin) = written.find(&key, same);
                if twin.is_none() {
                    written.record(key, i);
                }
                consume(Scouted::Whole(Whole {
                    part: i,
                    digest: Digest::Xxh3(digest),
                    twin,
                }))?;
            }
            Ok(())
        })
    })
}

/// The parts that can be streamed (hashed as they are written): each large
/// part whose length and first bytes no earlier large part has, so no
/// earlier part can have its bytes.
fn streamed_parts<'a, P>(n: usize, part: &P) -> Vec<usize>
where
    P: Fn(usize) -> &'a [u8],
{
    let mut seen: HashSet<(usize, u64)> = HashSet::new();
    (0..n)
        .filter(|&i| {
            let data = part(i);
            data.len() > CHUNK && seen.insert((data.len(), xxh3_64(&data[..PREFIX])))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every message, flattened to (part, digest, twin, streamed?) in order.
    fn run(parts: &[Vec<u8>]) -> Vec<(usize, u64, Option<usize>, bool)> {
        let mut out = Vec::new();
        let mut streamed_to = 0;
        scout(
            parts.len(),
            |i| &parts[i][..],
            |m| {
                match m {
                    Scouted::Whole(w) => {
                        let Digest::Xxh3(d) = w.digest else { panic!() };
                        out.push((w.part, d, w.twin, false));
                    }
                    Scouted::Chunk { part, end } => {
                        // The next chunk on this thread, or the whole part
                        // at once when the helper hashes it.
                        let len = parts[part].len();
                        let next = (streamed_to + CHUNK).min(len);
                        assert!(end == next || (streamed_to == 0 && end == len));
                        streamed_to = end;
                    }
                    Scouted::Streamed { part, digest } => {
                        assert_eq!(streamed_to, parts[part].len(), "every byte announced");
                        streamed_to = 0;
                        let Digest::Xxh3(d) = digest else { panic!() };
                        out.push((part, d, None, true));
                    }
                }
                Ok(())
            },
        )
        .unwrap();
        out
    }

    fn noise(len: usize, seed: u8) -> Vec<u8> {
        (0..len)
            .map(|i| (i as u8).wrapping_mul(31) ^ seed)
            .collect()
    }

    #[test]
    fn digests_match_one_shot_hashes_and_twins_are_found() {
        let big = noise(CHUNK * 2 + 17, 1);
        let mut big_tail = big.clone();
        *big_tail.last_mut().unwrap() ^= 1; // same length and prefix, other bytes
        let parts = vec![
            noise(100, 1),
            big.clone(),
            noise(100, 1),
            big_tail.clone(),
            big.clone(),
            vec![],
            vec![],
        ];
        let got = run(&parts);
        let order: Vec<usize> = got.iter().map(|g| g.0).collect();
        assert_eq!(order, (0..parts.len()).collect::<Vec<_>>());
        for (i, d, _, _) in &got {
            assert_eq!(*d, xxhash_rust::xxh3::xxh3_64(&parts[*i]), "part {i}");
        }
        let twins: Vec<Option<usize>> = got.iter().map(|g| g.2).collect();
        assert_eq!(twins, [None, None, Some(0), None, Some(1), None, Some(5)]);
        let streamed: Vec<bool> = got.iter().map(|g| g.3).collect();
        // Only the first large part of its length and prefix is streamed.
        assert_eq!(streamed, [false, true, false, false, false, false, false]);
    }

    #[test]
    fn small_parts_hashed_ahead_keep_digests_and_twins() {
        // Enough small parts for the helper thread (several batches), every
        // tenth a repeat of an earlier one, large parts among them.
        let parts: Vec<Vec<u8>> = (0..800)
            .map(|i| match i % 10 {
                9 => noise(10_000, (i / 10 % 20) as u8),
                5 if i % 100 == 5 => noise(CHUNK + 4096, i as u8),
                _ => {
                    let mut p = noise(10_000, i as u8);
                    p[..4].copy_from_slice(&(i as u32).to_le_bytes());
                    p
                }
            })
            .collect();
        let got = run(&parts);
        assert_eq!(got.len(), parts.len());
        let mut first: std::collections::HashMap<&[u8], usize> = Default::default();
        for (i, d, twin, _) in &got {
            assert_eq!(*d, xxhash_rust::xxh3::xxh3_64(&parts[*i]), "part {i}");
            let want = match first.get(&parts[*i][..]) {
                Some(&j) => Some(j),
                None => {
                    first.insert(&parts[*i][..], *i);
                    None
                }
            };
            assert_eq!(*twin, want, "part {i}");
        }
        assert!(got.iter().any(|g| g.2.is_some()));
    }

    #[test]
    fn large_parts_hashed_by_the_helper_keep_digests_and_twins() {
        // Enough large bytes for the helper: distinct parts, a repeat, a
        // part of the same length and prefix with another tail.
        let big = |seed: u8| noise(3 << 20, seed);
        let mut tail = big(1);
        *tail.last_mut().unwrap() ^= 1;
        let parts = vec![big(1), big(2), big(3), big(1), tail, big(4), big(2)];
        let got = run(&parts);
        for (i, d, _, _) in &got {
            assert_eq!(*d, xxhash_rust::xxh3::xxh3_64(&parts[*i]), "part {i}");
        }
        let twins: Vec<Option<usize>> = got.iter().map(|g| g.2).collect();
        assert_eq!(twins, [None, None, None, Some(0), None, None, Some(1)]);
        let streamed: Vec<bool> = got.iter().map(|g| g.3).collect();
        assert_eq!(streamed, [true, true, true, false, false, true, false]);
    }

    #[test]
    fn a_writer_error_stops_the_scout() {
        let parts: Vec<Vec<u8>> = (0..64).map(|i| noise(CHUNK * 3, i as u8)).collect();
        let mut seen = Vec::new();
        let err = scout(
            parts.len(),
            |i| &parts[i][..],
            |m| {
                seen.push(m);
                Err(io::Error::other("disk full"))
            },
        )
        .unwrap_err();
        assert_eq!(err.to_string(), "disk full");
        // One chunk on this thread, or the whole part when the helper
        // hashes it; nothing after the refusal.
        assert!(
            matches!(
                seen[..],
                [Scouted::Chunk { part: 0, end }] if end == CHUNK || end == CHUNK * 3
            ),
            "{seen:?}"
        );
    }
}
