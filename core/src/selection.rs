//! Reading a selection of a tensor (a start, count and step per
//! dimension) as the stored runs it covers, without reading the rest:
//! copied from a mapping run by run, read positionally, fetched from object
//! storage as one planned batch, or cut from the decoded span.

use crate::rule::Rule;
use std::borrow::Cow;

use crate::catalog::Payload;
use crate::error::{Error, Result};
use crate::part::PartRef;

/// One dimension of a selection for [`PartRef::read_selection`]: the
/// indices `start, start + step, ...`, `count` of them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sel {
    /// First index.
    pub start: u64,
    /// How many indices.
    pub count: u64,
    /// Distance between them (at least 1).
    pub step: u64,
}

impl Sel {
    /// Every index of a dimension of length `dim`.
    pub fn all(dim: u64) -> Sel {
        Sel {
            start: 0,
            count: dim,
            step: 1,
        }
    }
}

/// Runs closer than this are read as one: below any request's cost, and it
/// keeps a strided selection (every other column) from becoming one range
/// per element.
const SELECTION_GAP: u64 = 512;

impl PartRef<'_> {
    /// The elements of a selection (a [`Sel`] per dimension), in C order,
    /// reading only the bytes it needs: the stored runs it covers, gathered
    /// from the mapping, read positionally one run at a time, or from a
    /// remote object as one planned batch of ranged reads (which the
    /// object's own planner may coalesce further). A decoded part decodes
    /// only the range the runs span (for seekable encodings, the frames it
    /// touches). Needs a contiguous part of whole-byte elements.
    pub fn read_selection(&self, sel: &[Sel]) -> Result<Vec<u8>> {
        self.guard()?;
        let ctx = self.ctx();
        let Some(size) = self.part.dtype.size() else {
            return Err(Error::Unsupported {
                rule: Rule::ACCESS_VIEW,
                ctx,
                reason: format!("{} elements are smaller than a byte", self.part.dtype),
            });
        };
        if !self.is_contiguous() {
            return Err(Error::Unsupported {
                rule: Rule::ACCESS_VIEW,
                ctx,
                reason: "the part is not stored in C order".into(),
            });
        }
        let shape = &self.part.shape;
        if sel.len() != shape.len() {
            return Err(Error::range(
                ctx,
                Rule::ACCESS_SELECTION,
                format!("{} selections for rank {}", sel.len(), shape.len()),
            ));
        }
        for (d, (s, &dim)) in sel.iter().zip(shape).enumerate() {
            let last = s
                .count
                .checked_sub(1)
                .map(|n| n.checked_mul(s.step).and_then(|x| x.checked_add(s.start)));
            let fits = match last {
                None => s.start <= dim,
                Some(Some(last)) => s.step >= 1 && last < dim,
                Some(None) => false,
            };
            if !fits {
                return Err(Error::range(
                    ctx,
                    Rule::ACCESS_SELECTION,
                    format!(
                        "selection {}:{}:{} of dimension {d} (size {dim})",
                        s.start, s.count, s.step
                    ),
                ));
            }
        }
        let overflow = || Error::Overflow {
            rule: Rule::OVERFLOW,
            ctx: self.ctx(),
            what: "selection size",
        };
        let count = sel
            .iter()
            .try_fold(1u64, |acc, s| acc.checked_mul(s.count))
            .ok_or_else(overflow)?;
        let out_len = count.checked_mul(size).ok_or_else(overflow)?;
        self.source.limits.check_decoded(&self.ctx(), out_len)?;
        if count == 0 {
            return Ok(Vec::new());
        }
        let runs = Runs::new(shape, sel, size);
        let mut out = crate::buffer::try_with_capacity(&self.ctx(), "a selection", out_len)?;
        match &self.part.payload {
            Payload::Stored { store, offset, len } if store.is_mapped() => {
                // Copy run by run: only the pages the runs touch are read.
                let all = store.slice(*offset, *len)?;
                runs.for_each(|at, n| out.extend_from_slice(&all[at as usize..(at + n) as usize]));
            }
            Payload::Stored { store, offset, .. } => {
                let reads = runs.coalesced(SELECTION_GAP);
                let ranges: Vec<(u64, u64)> = reads.iter().map(|&(a, n)| (offset + a, n)).collect();
                let fetched = store
                    .read_many(&ranges)
                    .map_err(|e| e.in_tensor(&self.object.name))?;
                gather(&runs, &reads, &fetched, &mut out);
            }
            Payload::Decoded { .. } => {
                let (first, end) = runs.envelope();
                let span = self.storage_range(first, end - first)?;
                runs.for_each(|at, n| {
                    let at = (at - first) as usize;
                    out.extend_from_slice(&span[at..at + n as usize]);
                });
            }
        }
        debug_assert_eq!(out.len() as u64, out_len);
        Ok(out)
    }
}

/// The stored runs of a selection over a C-order array, in output order:
/// byte offsets (from the part's start) and lengths.
struct Runs {
    /// Byte strides of the dimensions.
    strides: Vec<u64>,
    /// The selection over the dimensions that are walked (those before the
    /// first run-internal dimension).
    outer: Vec<Sel>,
    /// Bytes per run.
    run: u64,
    /// Byte offset of the first run's start along the run dimension.
    base: u64,
}

impl Runs {
    fn new(shape: &[u64], sel: &[Sel], size: u64) -> Runs {
        let rank = shape.len();
        let mut strides = vec![size; rank];
        for d in (0..rank.saturating_sub(1)).rev() {
            strides[d] = strides[d + 1] * shape[d + 1];
        }
        // Trailing dimensions taken whole fold into the run; so does the
        // last partial one if its step is 1.
        let mut k = rank;
        while k > 0 && sel[k - 1] == Sel::all(shape[k - 1]) {
            k -= 1;
        }
        let inner = if k == rank {
            size
        } else {
            strides[k] * shape[k]
        };
        let (outer, run, base) = match k.checked_sub(1) {
            None => (Vec::new(), inner, 0),
            Some(j) if sel[j].step == 1 => (
                sel[..j].to_vec(),
                sel[j].count * strides[j],
                sel[j].start * strides[j],
            ),
            Some(j) => (sel[..=j].to_vec(), strides[j], 0),
        };
        Runs {
            strides,
            outer,
            run,
            base,
        }
    }

    /// Call `f(offset, len)` for every run, in order (offsets increase).
    fn for_each(&self, mut f: impl FnMut(u64, u64)) {
        let rank = self.outer.len();
        let mut idx = vec![0u64; rank];
        loop {
            let at = self.base
                + idx
                    .iter()
                    .zip(&self.outer)
                    .zip(&self.strides)
                    .map(|((&i, s), &st)| (s.start + i * s.step) * st)
                    .sum::<u64>();
            f(at, self.run);
            let mut d = rank;
            loop {
                if d == 0 {
                    return;
                }
                d -= 1;
                idx[d] += 1;
                if idx[d] < self.outer[d].count {
                    break;
                }
                idx[d] = 0;
            }
        }
    }

    /// The runs merged where they are closer than `gap` bytes.
    fn coalesced(&self, gap: u64) -> Vec<(u64, u64)> {
        let mut reads: Vec<(u64, u64)> = Vec::new();
        self.for_each(|at, n| match reads.last_mut() {
            Some((start, len)) if at <= *start + *len + gap => *len = at + n - *start,
            _ => reads.push((at, n)),
        });
        reads
    }

    /// `[first byte, end)` the runs span.
    fn envelope(&self) -> (u64, u64) {
        let (mut first, mut end) = (None, 0);
        self.for_each(|at, n| {
            first.get_or_insert(at);
            end = at + n;
        });
        (first.unwrap_or(0), end)
    }
}

/// Copy the runs out of the coalesced reads that hold them.
fn gather(runs: &Runs, reads: &[(u64, u64)], fetched: &[Cow<'_, [u8]>], out: &mut Vec<u8>) {
    let mut r = 0;
    runs.for_each(|at, n| {
        while reads[r].0 + reads[r].1 < at + n {
            r += 1;
        }
        let from = (at - reads[r].0) as usize;
        out.extend_from_slice(&fetched[r][from..from + n as usize]);
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every selection of a small array, against indexing it directly.
    #[test]
    fn runs_cover_exactly_the_selection() {
        let shape = [3u64, 4, 5];
        let at = |i: u64, j: u64, k: u64| (i * 20 + j * 5 + k) as u8;
        let sels = |dim: u64| {
            let mut v = vec![Sel::all(dim)];
            for start in 0..dim {
                for step in 1..=dim {
                    for count in 0..=((dim - start - 1) / step + 1) {
                        v.push(Sel { start, count, step });
                    }
                }
            }
            v
        };
        let bytes: Vec<u8> = (0..60).collect();
        for a in sels(3) {
            for b in sels(4).into_iter().step_by(3) {
                for c in sels(5).into_iter().step_by(2) {
                    let sel = [a, b, c];
                    if sel.iter().any(|s| s.count == 0) {
                        continue;
                    }
                    let runs = Runs::new(&shape, &sel, 1);
                    let mut got = Vec::new();
                    runs.for_each(|o, n| {
                        got.extend_from_slice(&bytes[o as usize..(o + n) as usize])
                    });
                    let mut want = Vec::new();
                    for i in 0..a.count {
                        for j in 0..b.count {
                            for k in 0..c.count {
                                want.push(at(
                                    a.start + i * a.step,
                                    b.start + j * b.step,
                                    c.start + k * c.step,
                                ));
                            }
                        }
                    }
                    assert_eq!(got, want, "{sel:?}");
                    let reads = runs.coalesced(2);
                    let fetched: Vec<Cow<'_, [u8]>> = reads
                        .iter()
                        .map(|&(o, n)| Cow::Borrowed(&bytes[o as usize..(o + n) as usize]))
                        .collect();
                    let mut gathered = Vec::new();
                    gather(&runs, &reads, &fetched, &mut gathered);
                    assert_eq!(gathered, want, "{sel:?} coalesced");
                }
            }
        }
    }
}
