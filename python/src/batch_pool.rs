//! Reused output buffers for large gathers.
//!
//! An array over 32 MiB (glibc's largest mmap threshold) gets fresh pages
//! from the kernel every time it is allocated, and the gather that fills it
//! then faults each page in and waits for the kernel to zero it. For a
//! training loop that gathers a batch, uses it and drops it, that is most
//! of the cost: batches of images gathered into fresh `np.empty` arrays
//! took well over twice as long as into one reused buffer, raw or zstd
//! (`python -m harness --only zrecord` compares the vision gathers with
//! loaderx).
//!
//! So the buffers of large batches that Python has dropped are kept (a few,
//! bounded in count and bytes) and handed to the next gather of a similar
//! size. A buffer is zeroed once, when first allocated, so no byte of it is
//! ever uninitialised. Buffers are `u64` words, so they are aligned for any
//! element type (Ragged payloads are viewed as the store's dtype).

use std::sync::Mutex;

use pyo3::exceptions::PyMemoryError;
use pyo3::prelude::*;

use crate::array::ArrayView;

/// Batches smaller than this come from `np.empty`: the allocator already
/// reuses memory below its mmap threshold.
pub const POOLED_FROM: usize = 16 << 20;
/// Most buffers kept for reuse, and most bytes.
const KEEP_BUFFERS: usize = 4;
const KEEP_BYTES: usize = 256 << 20;

static FREE: Mutex<Vec<Vec<u64>>> = Mutex::new(Vec::new());

/// Bytes a kept buffer holds on to.
fn held(words: &Vec<u64>) -> usize {
    words.capacity() * 8
}

/// A buffer that goes back to the pool, if it is large, when the last
/// array using it dies.
pub struct Pooled(Vec<u64>);

impl Pooled {
    /// Wrap a buffer (a small one is simply freed when dropped).
    pub fn new(words: Vec<u64>) -> Self {
        Pooled(words)
    }

    /// The address of its first byte.
    pub fn address(&self) -> usize {
        self.0.as_ptr() as usize
    }
}

impl Drop for Pooled {
    /// Keep the buffer if it is large; the oldest kept ones make room (the
    /// latest batch sizes are the ones asked for next).
    fn drop(&mut self) {
        let buf = std::mem::take(&mut self.0);
        if held(&buf) < POOLED_FROM || held(&buf) > KEEP_BYTES {
            return;
        }
        let mut free = FREE.lock().unwrap_or_else(|e| e.into_inner());
        free.push(buf);
        while free.len() > KEEP_BUFFERS || free.iter().map(held).sum::<usize>() > KEEP_BYTES {
            free.remove(0);
        }
    }
}

/// A buffer of at least `len` bytes: the latest kept one no more than
/// twice that size, else a new zeroed one; `None` when that cannot be
/// allocated (`len` is the caller's: a gather of millions of duplicate
/// indices asks for more than the machine has).
fn take(len: usize) -> Option<Pooled> {
    let words = len.div_ceil(8);
    let mut free = FREE.lock().unwrap_or_else(|e| e.into_inner());
    let fits = free
        .iter()
        .rposition(|b| b.len() >= words && b.len() / 2 <= words);
    match fits {
        Some(i) => Some(Pooled(free.swap_remove(i))),
        None => {
            drop(free);
            // calloc: zeroed by the kernel on first touch, and a failure is
            // reported where `vec![0; words]` would abort the process.
            zrecord::reader::zeroed_words(words).map(Pooled)
        }
    }
}

/// The most recently kept buffer, or an empty one: for a Ragged gather,
/// whose size is known only once it has looked its records up (the gather
/// resizes it; batches of one workload are alike in size).
pub fn take_latest() -> Vec<u64> {
    let mut free = FREE.lock().unwrap_or_else(|e| e.into_inner());
    free.pop().unwrap_or_default()
}

/// A writable uint8 array of `nbytes` for a gather to fill (its old
/// contents are unspecified), drawn from the pool of dropped batches;
/// `MemoryError` when no buffer of that size can be allocated.
#[pyfunction]
pub fn batch_buffer(nbytes: usize) -> PyResult<ArrayView> {
    let buf = take(nbytes).ok_or_else(|| {
        PyMemoryError::new_err(format!(
            "out of memory: cannot allocate {nbytes} bytes for a batch buffer"
        ))
    })?;
    let address = buf.address();
    Ok(ArrayView::pooled(buf, address, nbytes))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The pool is global: tests that fill or drain it take turns.
    static SERIAL: Mutex<()> = Mutex::new(());

    #[test]
    fn a_dropped_buffer_is_reused_for_a_similar_size_only() {
        let _turn = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
        FREE.lock().unwrap().clear();
        let first = take(POOLED_FROM).unwrap();
        let address = first.address();
        drop(first);
        // Far smaller: a new buffer, the kept one stays.
        let small = take(POOLED_FROM / 4).unwrap();
        assert_ne!(small.address(), address);
        let again = take(POOLED_FROM - 100).unwrap();
        assert_eq!(again.address(), address);
    }

    #[test]
    fn the_pool_keeps_the_latest_buffers_within_its_bounds() {
        let _turn = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
        FREE.lock().unwrap().clear();
        let bufs: Vec<Pooled> = (0..KEEP_BUFFERS + 3)
            .map(|_| take(KEEP_BYTES / 2).unwrap())
            .collect();
        let last = bufs.last().unwrap().address();
        drop(bufs);
        {
            let free = FREE.lock().unwrap();
            assert!(free.iter().map(held).sum::<usize>() <= KEEP_BYTES);
            assert!(free.len() <= KEEP_BUFFERS);
        }
        // The last one dropped is kept, and handed out first.
        assert_eq!(take(KEEP_BYTES / 2).unwrap().address(), last);
        // Small buffers, and one larger than the whole pool, are not kept.
        drop(Pooled::new(vec![0u64; 1000]));
        drop(take(KEEP_BYTES + 8).unwrap());
        assert!(FREE
            .lock()
            .unwrap()
            .iter()
            .all(|b| held(b) >= POOLED_FROM && held(b) <= KEEP_BYTES));
    }

    #[test]
    fn a_buffer_past_the_address_space_is_refused_not_aborted() {
        let _turn = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
        FREE.lock().unwrap().clear();
        // 2^60 bytes: more than any machine maps (47-bit user space), and
        // usize::MAX bytes (2^61 words) pass what a Layout can describe.
        assert!(take(1 << 60).is_none());
        assert!(take(usize::MAX).is_none());
    }

    #[test]
    fn small_buffers_are_not_kept() {
        let _turn = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
        FREE.lock().unwrap().clear();
        drop(Pooled::new(vec![0u64; 1000]));
        assert!(FREE.lock().unwrap().is_empty());
        drop(take(POOLED_FROM).unwrap());
        assert_eq!(take_latest().len(), POOLED_FROM / 8);
    }
}
