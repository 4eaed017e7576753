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
/// On a thread [`recycling`] buffers, a large one is a recycled buffer
/// zeroed again (its pages are resident: no fault per page).
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
    if let Some(mut v) = take_recycled(n) {
        v.clear();
        v.resize(n, 0);
        return Ok(v);
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

/// `len` initialised bytes whose values are unspecified (a recycled
/// buffer's old bytes, or zeros), or [`Error::Memory`]: for a caller that
/// overwrites every byte (a `pread` that fills it, a decoder that writes
/// every value), so a recycled buffer is not zeroed first.
pub fn try_for_overwrite(ctx: &Context, what: &'static str, len: u64) -> Result<Vec<u8>> {
    if let Some(mut v) = usize::try_from(len).ok().and_then(take_recycled) {
        let n = len as usize;
        if v.len() >= n {
            v.truncate(n);
        } else {
            v.resize(n, 0);
        }
        return Ok(v);
    }
    try_zeroed(ctx, what, len)
}

/// Buffers smaller than this are left to the allocator: only large ones
/// cost a page fault per 4 KiB when fresh.
const RECYCLE_MIN: usize = 1 << 20;

/// What a [`Recycler`] keeps at most: two buffers (a tensor's output and
/// the quantized blocks it was decoded from), 48 MiB in all, so a
/// conversion's peak memory stays within its bound (largest tensor + 256
/// MiB) with the fetch-ahead and read-ahead windows beside it.
const RECYCLE_KEEP: usize = 2;
const RECYCLE_BYTES: usize = 48 << 20;

/// Large buffers a writer is done with, handed again to the thread that
/// fetches (decodes) its next tensors ([`recycling`]): a fresh allocation
/// of tens of MiB is unmapped memory the kernel faults in and zeroes page
/// by page on its first write, and the allocator unmaps it again when it
/// is freed, so a conversion decoding tensor after tensor paid that for
/// every tensor (issue 41). Dropped with the conversion, so nothing is
/// held after it.
#[derive(Debug, Default)]
pub struct Recycler {
    held: std::sync::Mutex<Vec<Vec<u8>>>,
}

impl Recycler {
    /// An empty recycler.
    pub fn new() -> std::sync::Arc<Recycler> {
        std::sync::Arc::default()
    }

    /// Keep `v` for a later allocation of about its size; a small one, or
    /// one past what is kept, is freed.
    pub fn put(&self, v: Vec<u8>) {
        if v.capacity() < RECYCLE_MIN {
            return;
        }
        let mut held = self.held.lock().unwrap_or_else(|e| e.into_inner());
        let bytes: usize = held.iter().map(Vec::capacity).sum();
        if held.len() < RECYCLE_KEEP && bytes + v.capacity() <= RECYCLE_BYTES {
            held.push(v);
        }
    }

    /// The smallest kept buffer with room for `n` bytes and at most twice
    /// that (a large buffer is not spent on a small tensor).
    fn take(&self, n: usize) -> Option<Vec<u8>> {
        let mut held = self.held.lock().unwrap_or_else(|e| e.into_inner());
        let (at, _) = held
            .iter()
            .enumerate()
            .filter(|(_, v)| v.capacity() >= n && v.capacity() / 2 <= n)
            .min_by_key(|(_, v)| v.capacity())?;
        Some(held.swap_remove(at))
    }
}

thread_local! {
    /// The recycler [`try_zeroed`] and [`try_for_overwrite`] take from on
    /// this thread, while [`recycling`] runs.
    static RECYCLER: std::cell::RefCell<Option<std::sync::Arc<Recycler>>> =
        const { std::cell::RefCell::new(None) };
}

/// Run `f` with large allocations on this thread ([`try_zeroed`],
/// [`try_for_overwrite`]) served from `recycler` where it holds a buffer of
/// the size, and [`recycle`] giving buffers back to it.
pub fn recycling<R>(recycler: &std::sync::Arc<Recycler>, f: impl FnOnce() -> R) -> R {
    struct Restore(Option<std::sync::Arc<Recycler>>);
    impl Drop for Restore {
        fn drop(&mut self) {
            let before = self.0.take();
            RECYCLER.with(|r| *r.borrow_mut() = before);
        }
    }
    let before = RECYCLER.with(|r| r.borrow_mut().replace(std::sync::Arc::clone(recycler)));
    let _restore = Restore(before);
    f()
}

/// Give `v` to this thread's recycler ([`recycling`]), if it has one; else
/// free it.
pub fn recycle(v: Vec<u8>) {
    RECYCLER.with(|r| {
        if let Some(r) = r.borrow().as_ref() {
            r.put(v);
        }
    });
}

/// A buffer of room for `n` bytes from this thread's recycler, if any.
fn take_recycled(n: usize) -> Option<Vec<u8>> {
    if n < RECYCLE_MIN {
        return None;
    }
    RECYCLER.with(|r| r.borrow().as_ref().and_then(|r| r.take(n)))
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

    /// While recycling, a large allocation reuses a buffer given back of
    /// about its size (zeroed again by `try_zeroed`, its old bytes kept by
    /// `try_for_overwrite`), small and far larger ones are left alone, at
    /// most two are kept, and nothing is taken outside `recycling`.
    #[test]
    fn recycled_buffers_are_reused_within_their_scope() {
        let ctx = crate::error::Context::default();
        let r = super::Recycler::new();
        let mib = 1usize << 20;
        let old = |n: usize| vec![7u8; n];
        r.put(old(4 * mib));
        let outside = super::try_for_overwrite(&ctx, "x", 4 * mib as u64).unwrap();
        assert!(
            outside.iter().all(|&b| b == 0),
            "no recycler here: fresh zeros"
        );
        super::recycling(&r, || {
            let v = super::try_for_overwrite(&ctx, "x", 3 * mib as u64).unwrap();
            assert_eq!(v.len(), 3 * mib);
            assert!(
                v.iter().all(|&b| b == 7),
                "the recycled buffer's bytes, not zeroed"
            );
            assert_eq!(v.capacity(), 4 * mib);
            super::recycle(v);
            let z = super::try_zeroed(&ctx, "x", 4 * mib as u64).unwrap();
            assert_eq!(z.capacity(), 4 * mib);
            assert!(z.len() == 4 * mib && z.iter().all(|&b| b == 0));
            // A buffer more than twice the size asked is not spent on it.
            super::recycle(z);
            let small = super::try_zeroed(&ctx, "x", mib as u64 + 1).unwrap();
            assert_ne!(small.capacity(), 4 * mib);
            let _ = super::try_zeroed(&ctx, "x", 4 * mib as u64).unwrap();
            // Longer than the kept buffer's length: its bytes, then zeros.
            let mut short = Vec::with_capacity(4 * mib);
            short.resize(mib, 7u8);
            super::recycle(short);
            let grown = super::try_for_overwrite(&ctx, "x", 3 * mib as u64).unwrap();
            assert_eq!(grown.len(), 3 * mib);
            assert!(grown[..mib].iter().all(|&b| b == 7) && grown[mib..].iter().all(|&b| b == 0));
        });
        // Outside the scope, giving back frees.
        super::recycle(old(4 * mib));
        assert!(r.held.lock().unwrap().is_empty());
        // Small buffers are not kept; at most two are.
        r.put(vec![1u8; 1000]);
        for _ in 0..3 {
            r.put(old(2 * mib));
        }
        assert_eq!(r.held.lock().unwrap().len(), 2);
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
