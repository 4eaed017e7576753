//! The decoder every scheme's output shares: a tensor made of whole units
//! (rows of a matrix, or experts) of equal size, each computed from its own
//! slice of the quantized inputs. A scheme says how many units there are,
//! their size, and how to fill a run of them; [`ByUnits`] makes that a
//! [`Decode`] whose output is bounded by the limits before it is allocated,
//! and whose ranges decode only the units they meet (so a conversion holds
//! one piece of a tensor's output, never its f32 copy).

use std::fmt;

use zt_core::error::{Context, Result};
use zt_core::{Decode, Limits};

/// A quantized tensor decoded a run of whole units at a time.
pub(super) trait Units: Send + Sync + fmt::Debug {
    /// The decoder's name in listings ([`Decode::describe`]).
    const DESCRIBE: &'static str;
    /// What the output is, for an allocation that fails.
    const WHAT: &'static str = "a dequantized tensor";

    /// Units in the whole tensor.
    fn count(&self) -> u64;

    /// Output bytes per unit.
    fn unit_bytes(&self) -> u64;

    /// Whether [`Units::fill`] writes every byte of its output, which then
    /// need not be zeroed first (a recycled buffer keeps its old bytes).
    const OVERWRITES: bool = false;

    /// Units `[first, first + out.len() / unit_bytes)` into `out`, which
    /// is zeroed (unless [`Units::OVERWRITES`]), whole units, and never
    /// empty.
    fn fill(&self, first: u64, out: &mut [u8], limits: &Limits) -> Result<()>;
}

/// A [`Units`] as a seekable [`Decode`].
#[derive(Debug)]
pub(super) struct ByUnits<T>(pub T);

impl<T: Units> ByUnits<T> {
    /// Units `[first, first + count)`, in a buffer the limits allow.
    fn units(&self, first: u64, count: u64, limits: &Limits) -> Result<Vec<u8>> {
        let ctx = Context::default();
        let len = count * self.0.unit_bytes();
        limits.check_decoded(&ctx, len)?;
        let mut out = if T::OVERWRITES {
            zt_core::buffer::try_for_overwrite(&ctx, T::WHAT, len)?
        } else {
            zt_core::buffer::try_zeroed(&ctx, T::WHAT, len)?
        };
        // No units (or units of no bytes): nothing to read either.
        if !out.is_empty() {
            self.0.fill(first, &mut out, limits)?;
        }
        Ok(out)
    }
}

impl<T: Units> Decode for ByUnits<T> {
    fn decode(&self, limits: &Limits) -> Result<Vec<u8>> {
        self.units(0, self.0.count(), limits)
    }

    fn describe(&self) -> &'static str {
        T::DESCRIBE
    }

    fn seeks(&self) -> bool {
        true
    }

    /// The units the range meets, decoded, then cut to it.
    fn decode_range(&self, start: u64, len: u64, limits: &Limits) -> Result<Vec<u8>> {
        cut_to_range(start, len, self.0.unit_bytes(), |first, n| {
            self.units(first, n, limits)
        })
    }
}

/// Bytes `[start, start + len)` of an output made of whole units of
/// `unit` bytes (rows, or experts): `decode(first, count)` decodes the
/// units the range meets, which are then cut to it. A range decode costs
/// the units it covers, not the whole tensor.
fn cut_to_range(
    start: u64,
    len: u64,
    unit: u64,
    decode: impl FnOnce(u64, u64) -> Result<Vec<u8>>,
) -> Result<Vec<u8>> {
    if unit == 0 || len == 0 {
        return Ok(Vec::new());
    }
    let first = start / unit;
    let last = (start + len - 1) / unit;
    let units = decode(first, last + 1 - first)?;
    let from = (start - first * unit) as usize;
    Ok(units[from..from + len as usize].to_vec())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Unit `u` is `unit` bytes of `u + 1`.
    #[derive(Debug)]
    struct Counting {
        count: u64,
        unit: u64,
    }

    impl Units for Counting {
        const DESCRIBE: &'static str = "counting";

        fn count(&self) -> u64 {
            self.count
        }

        fn unit_bytes(&self) -> u64 {
            self.unit
        }

        fn fill(&self, first: u64, out: &mut [u8], _: &Limits) -> Result<()> {
            assert!(!out.is_empty() && out.len() as u64 % self.unit == 0);
            for (i, u) in out.chunks_exact_mut(self.unit as usize).enumerate() {
                u.fill((first + i as u64 + 1) as u8);
            }
            Ok(())
        }
    }

    #[test]
    fn ranges_decode_only_the_units_they_meet() {
        let d = ByUnits(Counting { count: 5, unit: 3 });
        let limits = Limits::default();
        assert_eq!(
            d.decode(&limits).unwrap(),
            [1, 1, 1, 2, 2, 2, 3, 3, 3, 4, 4, 4, 5, 5, 5]
        );
        assert_eq!(d.decode_range(4, 6, &limits).unwrap(), [2, 2, 3, 3, 3, 4]);
        assert!(d.decode_range(7, 0, &limits).unwrap().is_empty());
        assert_eq!(d.describe(), "counting");
        assert!(d.seeks());
    }

    #[test]
    fn no_units_fill_nothing() {
        let limits = Limits::default();
        let empty = ByUnits(Counting { count: 0, unit: 3 });
        assert!(empty.decode(&limits).unwrap().is_empty());
        let zero_width = ByUnits(Counting { count: 4, unit: 0 });
        assert!(zero_width.decode(&limits).unwrap().is_empty());
    }

    #[test]
    fn an_output_past_the_limits_is_refused_before_allocation() {
        let d = ByUnits(Counting {
            count: 1 << 40,
            unit: 1 << 20,
        });
        assert!(d.decode(&Limits::default()).is_err());
    }
}
