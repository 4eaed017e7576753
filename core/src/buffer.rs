//! Owned buffers for large tensors.
//!
//! A fresh multi-megabyte allocation is backed by untouched pages, so the
//! first write faults every 4 KiB page in. Asking for transparent huge pages
//! (as numpy's allocator does) cuts those faults ~512x and roughly triples
//! the speed of a large copy out of a mapping.

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
    fn swap_units_by_width() {
        let mut b = vec![1, 2, 3, 4, 5, 6, 7, 8];
        super::swap_units(&mut b, 4);
        assert_eq!(b, vec![4, 3, 2, 1, 8, 7, 6, 5]);
        super::swap_units(&mut b, 1);
        assert_eq!(b, vec![4, 3, 2, 1, 8, 7, 6, 5]);
    }
}
