//! Planning ranged GETs for a set of reads: large reads split into parts
//! fetched straight into their destination, small neighbouring reads
//! coalesced into one request. Pure arithmetic, tested on its own.
//!
//! `object_store`'s own `get_ranges` merges but never splits a large range;
//! one 2 GiB tensor would be one request on one connection.

/// One request of a plan.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Fetch {
    /// Bytes `[start, end)` of the object go straight into read `read` at
    /// `at` (a part of a large read, or a whole small read on its own).
    Into {
        /// Index of the read in the caller's list.
        read: usize,
        /// Offset inside that read's buffer.
        at: u64,
        /// Object range.
        start: u64,
        /// End of the object range.
        end: u64,
    },
    /// Bytes `[start, end)` go into a shared buffer that several small reads
    /// (`reads`) are then copied out of.
    Shared {
        /// Object range.
        start: u64,
        /// End of the object range.
        end: u64,
        /// The reads it serves.
        reads: Vec<usize>,
    },
}

/// Plan `reads` (`(offset, len)` each, inside the object): a read of at
/// least `part` bytes is split into `part`-sized requests into its own
/// buffer; smaller reads whose gaps are at most `gap` share a request of up
/// to `part` bytes, and (when `amplification` is not 0) of at most
/// `amplification` times the bytes its reads ask for, so no request
/// downloads more than that multiple of what it delivers. Empty reads need
/// no request.
pub fn plan(reads: &[(u64, u64)], part: u64, gap: u64, amplification: u32) -> Vec<Fetch> {
    let part = part.max(1);
    let mut order: Vec<usize> = (0..reads.len()).filter(|&i| reads[i].1 > 0).collect();
    order.sort_by_key(|&i| reads[i]);
    let mut out = Vec::new();
    // (start, end, the bytes its reads ask for, its reads)
    type Group = (u64, u64, u64, Vec<usize>);
    let mut group: Option<Group> = None;
    let within = |span: u64, asked: u64| {
        amplification == 0 || span <= asked.saturating_mul(u64::from(amplification))
    };
    let flush = |group: &mut Option<Group>, out: &mut Vec<Fetch>| {
        if let Some((start, end, _, members)) = group.take() {
            out.push(match members.as_slice() {
                [one] => Fetch::Into {
                    read: *one,
                    at: 0,
                    start,
                    end,
                },
                _ => Fetch::Shared {
                    start,
                    end,
                    reads: members,
                },
            });
        }
    };
    for i in order {
        let (offset, len) = reads[i];
        let end = offset + len;
        if len >= part {
            // A small group never reaches across a large read (it would
            // fetch the large read's bytes a second time).
            flush(&mut group, &mut out);
            let mut at = 0;
            while at < len {
                let n = part.min(len - at);
                out.push(Fetch::Into {
                    read: i,
                    at,
                    start: offset + at,
                    end: offset + at + n,
                });
                at += n;
            }
            continue;
        }
        match &mut group {
            Some((start, g_end, asked, members))
                if offset <= g_end.saturating_add(gap)
                    && end.max(*g_end) - *start <= part
                    && within(end.max(*g_end) - *start, *asked + len) =>
            {
                *g_end = (*g_end).max(end);
                *asked += len;
                members.push(i);
            }
            _ => {
                flush(&mut group, &mut out);
                group = Some((offset, end, len, vec![i]));
            }
        }
    }
    flush(&mut group, &mut out);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn large_reads_split_small_ones_merge() {
        let reads = [(100, 10), (0, 30), (50, 20), (1000, 250), (5000, 0)];
        let p = plan(&reads, 100, 25, 0);
        assert_eq!(
            p,
            [
                // 0..30 and 50..70 are 20 apart (<= 25); 100..110 is 30 after 70.
                Fetch::Shared {
                    start: 0,
                    end: 70,
                    reads: vec![1, 2]
                },
                Fetch::Into {
                    read: 0,
                    at: 0,
                    start: 100,
                    end: 110
                },
                Fetch::Into {
                    read: 3,
                    at: 0,
                    start: 1000,
                    end: 1100
                },
                Fetch::Into {
                    read: 3,
                    at: 100,
                    start: 1100,
                    end: 1200
                },
                Fetch::Into {
                    read: 3,
                    at: 200,
                    start: 1200,
                    end: 1250
                },
            ]
        );
    }

    #[test]
    fn a_group_never_spans_a_large_read() {
        let p = plan(&[(0, 10), (20, 500), (600, 10)], 100, 1 << 20, 0);
        assert_eq!(
            p[0],
            Fetch::Into {
                read: 0,
                at: 0,
                start: 0,
                end: 10
            }
        );
        assert_eq!(
            p.last(),
            Some(&Fetch::Into {
                read: 2,
                at: 0,
                start: 600,
                end: 610
            })
        );
    }

    #[test]
    fn a_group_never_exceeds_a_part() {
        let reads: Vec<(u64, u64)> = (0..10).map(|i| (i * 40, 30)).collect();
        for f in plan(&reads, 100, 1000, 0) {
            let (start, end) = match f {
                Fetch::Shared { start, end, .. } | Fetch::Into { start, end, .. } => (start, end),
            };
            assert!(end - start <= 100);
        }
    }

    #[test]
    fn every_byte_of_every_read_is_covered_once() {
        let reads = [(7, 300), (0, 5), (3, 4), (400, 64), (330, 1)];
        let mut covered: Vec<Vec<u8>> = reads.iter().map(|r| vec![0; r.1 as usize]).collect();
        for f in plan(&reads, 64, 16, 0) {
            match f {
                Fetch::Into {
                    read,
                    at,
                    start,
                    end,
                } => {
                    for b in &mut covered[read][at as usize..(at + end - start) as usize] {
                        *b += 1;
                    }
                }
                Fetch::Shared {
                    start,
                    end,
                    reads: members,
                } => {
                    for m in members {
                        let (o, l) = reads[m];
                        assert!(o >= start && o + l <= end);
                        covered[m].iter_mut().for_each(|b| *b += 1);
                    }
                }
            }
        }
        assert!(covered.iter().flatten().all(|&b| b == 1));
    }

    /// Small reads far apart in a large object: the gap would merge them
    /// all, the amplification bound keeps each request within 4x of what
    /// its reads ask for (and so the whole plan).
    #[test]
    fn amplification_is_bounded() {
        // 4 KiB records every 20 KiB, then a run of neighbours.
        let mut reads: Vec<(u64, u64)> = (0..8).map(|i| (i * 20_480, 4096)).collect();
        reads.extend((0..4).map(|i| ((1 << 20) + i * 4096, 4096)));
        let asked: u64 = reads.iter().map(|r| r.1).sum();
        let p = plan(&reads, 16 << 20, 1 << 20, 4);
        let mut fetched = 0;
        for f in &p {
            let (start, end, members) = match f {
                Fetch::Shared { start, end, reads } => (*start, *end, reads.clone()),
                Fetch::Into {
                    read, start, end, ..
                } => (*start, *end, vec![*read]),
            };
            let want: u64 = members.iter().map(|&m| reads[m].1).sum();
            assert!(end - start <= 4 * want, "{f:?}");
            fetched += end - start;
        }
        assert!(fetched <= 4 * asked);
        // Neighbours still share one request; spread records merge only
        // while the span stays within 4x (four of them: 64 KiB for 16 KiB).
        assert!(p.contains(&Fetch::Shared {
            start: 1 << 20,
            end: (1 << 20) + 4 * 4096,
            reads: vec![8, 9, 10, 11]
        }));
        assert!(p.len() < reads.len());
        // Unbounded, the gap alone decides: one request for everything.
        assert_eq!(plan(&reads, 16 << 20, 1 << 20, 0).len(), 1);
    }
}
