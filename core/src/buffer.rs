//! Owned buffers for large tensors.
//!
//! A fresh multi-megabyte allocation is backed by untouched pages, so the
//! first write faults every 4 KiB page in. Asking for transparent huge pages
//! (as numpy's allocator does) cuts those faults ~512x and roughly triples
//! the speed of a large copy out of a mapping.

use crate::error::{Context, Error, Result};

/// Allocations at least this large ask for huge pages.
const HUGE_PAGE_THRESHOLD: usize = 4 << 20;

/// An empty `Vec` with room for `len` bytes, advised to use huge pages when large.
pub fn with_capacity(len: usize) -> Vec<u8> {
    let v: Vec<u8> = Vec::with_capacity(len);
    if len >= HUGE_PAGE_THRESHOLD {
        advise_huge(v.as_ptr() as usize, len);
    }
    v
}

/// [`with_capacity`] that fails instead of aborting: the one path for every
/// buffer whose size comes from a file. `len` is checked against the
/// address space (a `u64` that does not fit a `usize` is an error too) and
/// allocation failure is [`Error::Memory`] naming `ctx` and `what`.
pub fn try_with_capacity(ctx: &Context, what: &'static str, len: u64) -> Result<Vec<u8>> {
    let fail = || Error::Memory {
        ctx: ctx.clone(),
        what,
        bytes: len,
    };
    let n = usize::try_from(len).map_err(|_| fail())?;
    let mut v: Vec<u8> = Vec::new();
    v.try_reserve_exact(n).map_err(|_| fail())?;
    if n >= HUGE_PAGE_THRESHOLD {
        advise_huge(v.as_ptr() as usize, n);
    }
    Ok(v)
}

/// `len` zero bytes, or [`Error::Memory`]. Zeroed allocation (`calloc`)
/// lets the kernel hand out zero pages lazily, so a large fill costs only
/// the pages later written, as `vec![0; len]` does, but without aborting.
pub fn try_zeroed(ctx: &Context, what: &'static str, len: u64) -> Result<Vec<u8>> {
    let fail = || Error::Memory {
        ctx: ctx.clone(),
        what,
        bytes: len,
    };
    let n = usize::try_from(len).map_err(|_| fail())?;
    if n == 0 {
        return Ok(Vec::new());
    }
    let layout = std::alloc::Layout::array::<u8>(n).map_err(|_| fail())?;
    // SAFETY: the layout has a non-zero size; a null return is failure.
    let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
    if ptr.is_null() {
        return Err(fail());
    }
    // SAFETY: `ptr` was allocated by the global allocator with the layout of
    // `n` bytes, all initialised (zeroed); length and capacity are `n`.
    Ok(unsafe { Vec::from_raw_parts(ptr, n, n) })
}

/// `n` zero `f32`s, or [`Error::Memory`]: [`try_zeroed`] for a decoder that
/// writes every value (dequantization), so its writes are the first touch
/// of each page, advised to be huge pages when large.
pub fn try_zeroed_f32(ctx: &Context, what: &'static str, n: u64) -> Result<Vec<f32>> {
    let fail = || Error::Memory {
        ctx: ctx.clone(),
        what,
        bytes: n.saturating_mul(4),
    };
    let n = usize::try_from(n).map_err(|_| fail())?;
    if n == 0 {
        return Ok(Vec::new());
    }
    let layout = std::alloc::Layout::array::<f32>(n).map_err(|_| fail())?;
    // SAFETY: the layout has a non-zero size; a null return is failure.
    let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
    if ptr.is_null() {
        return Err(fail());
    }
    if layout.size() >= HUGE_PAGE_THRESHOLD {
        advise_huge(ptr as usize, layout.size());
    }
    // SAFETY: allocated by the global allocator with the layout of `n` f32s,
    // all zero bits (0.0); length and capacity are `n`.
    Ok(unsafe { Vec::from_raw_parts(ptr.cast::<f32>(), n, n) })
}

/// Grow `v` by `additional` bytes of room, failing as [`try_with_capacity`] does.
pub fn try_reserve(
    v: &mut Vec<u8>,
    ctx: &Context,
    what: &'static str,
    additional: u64,
) -> Result<()> {
    let total = (v.len() as u64).saturating_add(additional);
    let fail = || Error::Memory {
        ctx: ctx.clone(),
        what,
        bytes: total,
    };
    let n = usize::try_from(additional).map_err(|_| fail())?;
    v.try_reserve(n).map_err(|_| fail())
}

/// A fallible owned copy of `bytes` (a `copy=True` load of a large tensor).
pub fn try_copy(ctx: &Context, what: &'static str, bytes: &[u8]) -> Result<Vec<u8>> {
    let mut v = try_with_capacity(ctx, what, bytes.len() as u64)?;
    v.extend_from_slice(bytes);
    Ok(v)
}

/// [`own`] that fails instead of aborting when a borrowed slice is copied.
pub fn try_own(
    ctx: &Context,
    what: &'static str,
    bytes: std::borrow::Cow<'_, [u8]>,
) -> Result<Vec<u8>> {
    match bytes {
        std::borrow::Cow::Borrowed(b) => try_copy(ctx, what, b),
        std::borrow::Cow::Owned(v) => Ok(v),
    }
}

/// An owned copy of `bytes` (see the module docs for why not `to_vec`).
pub fn copy(bytes: &[u8]) -> Vec<u8> {
    let mut v = with_capacity(bytes.len());
    v.extend_from_slice(bytes);
    v
}

/// Own `bytes`: an owned buffer is moved, a borrowed one copied (with
/// [`copy`]).
pub fn own(bytes: std::borrow::Cow<'_, [u8]>) -> Vec<u8> {
    match bytes {
        std::borrow::Cow::Borrowed(b) => copy(b),
        std::borrow::Cow::Owned(v) => v,
    }
}

/// Reverse each `width`-byte unit of `bytes` in place (big-endian scalars
/// to little-endian; a complex number swaps each half, so pass the scalar
/// width). Widths of 0 or 1 leave the bytes as they are.
pub fn swap_units(bytes: &mut [u8], width: usize) {
    if width > 1 {
        bytes.chunks_exact_mut(width).for_each(<[u8]>::reverse);
    }
}

/// `MADV_HUGEPAGE` on the whole pages inside `[start, start + len)`. Advice
/// only: failure (no THP support) changes nothing but speed.
fn advise_huge(start: usize, len: usize) {
    let page = crate::store::page_size() as usize;
    let first = start.div_ceil(page) * page;
    let end = (start + len) / page * page;
    if end > first {
        // SAFETY: [first, end) lies inside the allocation just made; the
        // advice does not change its contents or validity.
        unsafe {
            libc::madvise(first as *mut libc::c_void, end - first, libc::MADV_HUGEPAGE);
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn copies_exactly() {
        let src: Vec<u8> = (0..(5 << 20)).map(|i| i as u8).collect();
        assert_eq!(super::copy(&src), src);
        assert_eq!(super::copy(&[1, 2, 3]), vec![1, 2, 3]);
        assert!(super::copy(&[]).is_empty());
    }

    #[test]
    fn impossible_allocations_are_errors() {
        let ctx = crate::error::Context::file("f.bin").tensor("t");
        for len in [u64::MAX, 1 << 62, isize::MAX as u64 + 1] {
            let e = super::try_with_capacity(&ctx, "a test buffer", len).unwrap_err();
            assert!(matches!(e, crate::Error::Memory { .. }), "{e}");
            let msg = e.to_string();
            assert!(
                msg.contains("f.bin") && msg.contains("tensor \"t\""),
                "{msg}"
            );
        }
        assert_eq!(super::try_zeroed(&ctx, "x", 3).unwrap(), vec![0, 0, 0]);
        for n in [u64::MAX, 1 << 62, isize::MAX as u64 / 4 + 1] {
            let e = super::try_zeroed_f32(&ctx, "floats", n).unwrap_err();
            assert!(matches!(e, crate::Error::Memory { .. }), "{e}");
        }
        assert_eq!(super::try_zeroed_f32(&ctx, "x", 3).unwrap(), vec![0.0; 3]);
        let big = super::try_zeroed_f32(&ctx, "x", 3 << 20).unwrap();
        assert!(big.len() == 3 << 20 && big.iter().all(|x| x.to_bits() == 0));
        let mut v = vec![1u8];
        assert!(super::try_reserve(&mut v, &ctx, "x", u64::MAX).is_err());
    }

    #[test]
    fn swap_units_by_width() {
        let mut b = vec![1, 2, 3, 4, 5, 6, 7, 8];
        super::swap_units(&mut b, 4);
        assert_eq!(b, vec![4, 3, 2, 1, 8, 7, 6, 5]);
        super::swap_units(&mut b, 1);
        assert_eq!(b, vec![4, 3, 2, 1, 8, 7, 6, 5]);
    }
}
