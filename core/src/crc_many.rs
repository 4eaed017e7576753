//! CRC-32s of many byte ranges at once, on the cores their total warrants.
//!
//! A whole load of an npz archive checks every member's CRC-32 before its
//! bytes are handed out. Hashing the members one after another, each split
//! across the cores, pays a hand-off and a wait per member; here the ranges
//! are laid end to end and cut into one contiguous span per thread, so one
//! hand-off serves every member and members of any sizes share the work
//! evenly. CRC-32 combines: a range cut between two threads is hashed in two
//! pieces whose states, joined in order, are the whole range's.

use crc32fast::Hasher;

/// The least a thread beyond the first is given: a fraction of a
/// millisecond of hashing, many times what starting a thread costs.
const PIECE: u64 = 4 << 20;

/// The CRC-32 of each of `ranges`, in order.
pub fn crc32_each(ranges: &[&[u8]]) -> Vec<u32> {
    let total: u64 = ranges.iter().map(|r| r.len() as u64).sum();
    let threads = crate::copy::threads_for_pieces(total, PIECE) as u64;
    let step = total.div_ceil(threads).max(1);
    let span = |t: u64| hash_span(ranges, t * step, ((t + 1) * step).min(total));
    let spans: Vec<Vec<(usize, Hasher)>> = std::thread::scope(|scope| {
        let helpers: Vec<_> = (1..threads).map(|t| scope.spawn(move || span(t))).collect();
        let mut spans = vec![span(0)];
        spans.extend(
            helpers
                .into_iter()
                .map(|h| h.join().unwrap_or_else(|e| std::panic::resume_unwind(e))),
        );
        spans
    });
    let mut whole = vec![Hasher::new(); ranges.len()];
    // Spans are in order and each lists its pieces in order, so every
    // range's pieces are combined front to back.
    for (range, piece) in spans.into_iter().flatten() {
        whole[range].combine(&piece);
    }
    whole.into_iter().map(Hasher::finalize).collect()
}

/// The hash states of the pieces of `ranges` that fall in `[from, to)` of
/// their concatenation, each with its range's index, in order.
fn hash_span(ranges: &[&[u8]], from: u64, to: u64) -> Vec<(usize, Hasher)> {
    let mut pieces = Vec::new();
    let mut start = 0u64;
    for (i, range) in ranges.iter().enumerate() {
        let end = start + range.len() as u64;
        let (lo, hi) = (from.max(start), to.min(end));
        if lo < hi {
            let mut hasher = Hasher::new();
            hasher.update(&range[(lo - start) as usize..(hi - start) as usize]);
            pieces.push((i, hasher));
        }
        if end >= to {
            break;
        }
        start = end;
    }
    pieces
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bytes(len: usize, seed: u32) -> Vec<u8> {
        (0..len)
            .map(|i| (i as u32).wrapping_mul(2_654_435_761).wrapping_add(seed) as u8)
            .collect()
    }

    #[test]
    fn each_range_hashes_as_on_its_own_whatever_the_cuts() {
        // Sizes that put thread cuts inside ranges, on their edges, and
        // leave empty ranges between (a member of no bytes).
        let owned = [
            bytes(9 << 20, 1),
            Vec::new(),
            bytes(1, 2),
            bytes(3 << 20, 3),
            Vec::new(),
            bytes((4 << 20) + 17, 4),
            bytes(4096, 5),
        ];
        let ranges: Vec<&[u8]> = owned.iter().map(Vec::as_slice).collect();
        let expected: Vec<u32> = ranges.iter().map(|r| crc32fast::hash(r)).collect();
        assert_eq!(crc32_each(&ranges), expected);
        for n in 0..ranges.len() {
            assert_eq!(crc32_each(&ranges[n..]), expected[n..], "from range {n}");
        }
    }

    #[test]
    fn hash_span_covers_exactly_its_share() {
        let owned = [bytes(10, 1), bytes(0, 2), bytes(7, 3)];
        let ranges: Vec<&[u8]> = owned.iter().map(Vec::as_slice).collect();
        let pieces = hash_span(&ranges, 4, 12);
        let got: Vec<(usize, u32)> = pieces.into_iter().map(|(i, h)| (i, h.finalize())).collect();
        assert_eq!(
            got,
            vec![
                (0, crc32fast::hash(&owned[0][4..])),
                (2, crc32fast::hash(&owned[2][..2]))
            ]
        );
        assert!(hash_span(&ranges, 17, 17).is_empty());
        assert_eq!(crc32_each(&[]), Vec::<u32>::new());
    }
}
