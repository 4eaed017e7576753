//! A store and the page cache: everything a `Store` advises the kernel
//! about its pages, as opposed to the bytes it reads (`store.rs`).
//!
//! While a format walks a mapped file's structure (see
//! [`Store::begin_walk`]) the mapping is advised `MADV_RANDOM`: a fault on
//! a cold page then reads that page, not the device's whole readahead
//! window around it (8 MiB here), which a walk over a zip's local headers
//! or HDF5's object headers paid once per member, synchronously.
//!
//! Those single pages stay cached, scattered through the file, and the
//! kernel's readahead stops at every cached page it meets: a whole load
//! that reads the file in order after the walk restarts its readahead at
//! each one, with small pages (a torch checkpoint's whole load was
//! measurably slower to read in: `python -m harness --only cold`). So the walk
//! notes the pages it finds uncached (`mincore`, once a region:
//! `store/cold_pages.rs`) and a whole load drops
//! them again just before it reads their range
//! ([`Store::take_cold_walk_pages`], [`Store::drop_cached`]); a positional
//! store's walk learns the same with `preadv2(RWF_NOWAIT)`.

use std::sync::atomic::Ordering;

use std::os::unix::fs::FileExt;

use super::{page_size, read_piece_len, Backing, Store, WALK_SEQUENTIAL};
use crate::error::{Error, Result};
use crate::rule::Rule;

/// How many probes [`Store::looks_cached`] makes, and how long each is.
const PROBES: u64 = 8;
const PROBE: u64 = 64 << 10;

impl Store {
    /// Start a structure walk: until [`Store::end_walk`], the reads a
    /// format makes to find its tensors fault in only the pages they touch
    /// (`MADV_RANDOM`, advised at the walk's first read), except reads of
    /// at least 256 KiB, which keep normal readahead over their range. The opener brackets every format's
    /// `open` with the two calls. Advice only: no read returns different
    /// bytes. A positional store's descriptor is advised
    /// `POSIX_FADV_RANDOM` the same way (a short `pread` after another
    /// would start readahead); a remote store ignores both.
    pub fn begin_walk(&self) {
        if !self.is_remote() {
            self.walking.store(true, Ordering::Relaxed);
        }
    }

    /// The walk's advice, given once, at the walk's first read: a related
    /// file the walk only opens (a leaf whose length is all it checks)
    /// faults no page during the walk, so it needs no advice to take back.
    pub(super) fn advise_walk(&self) {
        if !self.walk_advised.swap(true, Ordering::Relaxed) {
            let _ = self.advise(0, self.len, libc::MADV_RANDOM);
            self.advise_descriptor(libc::POSIX_FADV_RANDOM);
        }
    }

    /// End the structure walk: the whole mapping gets normal readahead
    /// back, for the tensor reads that follow.
    pub fn end_walk(&self) {
        if self.walking.swap(false, Ordering::Relaxed) {
            if self.walk_advised.swap(false, Ordering::Relaxed) {
                let _ = self.advise(0, self.len, libc::MADV_NORMAL);
                self.advise_descriptor(libc::POSIX_FADV_NORMAL);
            }
            self.cold_pages.end_walk();
        }
    }

    /// `posix_fadvise` over the whole file of a positional store (its
    /// own descriptor, which every later read uses); advice only.
    pub(super) fn advise_descriptor(&self, advice: libc::c_int) {
        if let Backing::Positional(file) = &self.backing {
            use std::os::fd::AsRawFd;
            // SAFETY: advice on a descriptor this store owns.
            unsafe { libc::posix_fadvise(file.as_raw_fd(), 0, 0, advice) };
        }
    }

    /// True between [`Store::begin_walk`] and [`Store::end_walk`] on a
    /// local store.
    pub fn is_walking(&self) -> bool {
        self.walking.load(Ordering::Relaxed)
    }

    /// A read during a walk: a long one reads ahead normally; a short one
    /// notes which of its pages are not cached yet (the walk's fault will
    /// read them alone).
    pub(super) fn walk_read(&self, offset: u64, len: u64) {
        if !self.walking.load(Ordering::Relaxed) {
            return;
        }
        self.advise_walk();
        if len >= WALK_SEQUENTIAL {
            let _ = self.advise(offset, len, libc::MADV_NORMAL);
        } else {
            self.note_cold_pages(offset, len);
        }
    }

    /// Record the pages of `[offset, offset + len)` that were uncached
    /// when the walk first read near them (a short read of a mapped store;
    /// `mincore` asked once a region: see [`cold_pages`]).
    pub(super) fn note_cold_pages(&self, offset: u64, len: u64) {
        let Backing::Mapped(map) = &self.backing else {
            return;
        };
        let (start, end) = Self::page_envelope(offset, len.max(1));
        let end = end.min(map.len() as u64);
        let page = page_size();
        let probe = |region: u64, len: u64, out: &mut [u8]| {
            // A region the cache holds whole (a warm file) is answered by
            // one `cachestat` count; `mincore` looks each page up.
            if self.cached_pages(region, region + len) == Some(len.div_ceil(page)) {
                out.fill(1);
                return true;
            }
            // SAFETY: callers pass a page-aligned region inside the file,
            // so inside the mapping, and `out` a byte for each of its
            // pages; mincore only reports residency.
            let rc = unsafe {
                libc::mincore(
                    map.as_ptr().add(region as usize) as *mut libc::c_void,
                    len as usize,
                    out.as_mut_ptr(),
                )
            };
            rc == 0
        };
        self.cold_pages
            .note_uncached(start, end, page, map.len() as u64, probe);
    }

    /// The page ranges the walks so far read from the disk themselves
    /// (uncached when read), sorted and merged; the record is emptied. A
    /// whole load about to read over them drops them first
    /// ([`Store::drop_cached`]), so its readahead meets no stray cached
    /// page. Empty for remote stores.
    pub fn take_cold_walk_pages(&self) -> Vec<(u64, u64)> {
        self.cold_pages.take()
    }

    /// Drop the page-aligned `ranges` from this process's mapping and,
    /// where no other process maps them, from the page cache
    /// (`MADV_DONTNEED`, then `POSIX_FADV_DONTNEED` on the file). Advice
    /// only: the next read faults the same bytes back in from the file.
    pub fn drop_cached(&self, ranges: &[(u64, u64)]) -> Result<()> {
        if ranges.is_empty() {
            return Ok(());
        }
        for &(start, end) in ranges {
            self.evict_pages(start, end)?;
        }
        let reopened;
        let file = match &self.backing {
            Backing::Positional(file) => Some(file),
            _ => {
                reopened = self.reopen();
                reopened.as_ref()
            }
        };
        if let Some(file) = file {
            use std::os::fd::AsRawFd;
            for &(start, end) in ranges {
                // SAFETY: fadvise on an open descriptor of this store's own
                // file (same inode); advice only, it changes no byte a read
                // returns.
                unsafe {
                    libc::posix_fadvise(
                        file.as_raw_fd(),
                        start as libc::off_t,
                        (end - start) as libc::off_t,
                        libc::POSIX_FADV_DONTNEED,
                    )
                };
            }
        }
        Ok(())
    }

    /// Fetch the small `ranges` a structure walk is about to visit: for a
    /// remote object one planned batch of requests (coalesced, concurrent)
    /// into its cache, instead of one request per structure. Local stores
    /// need nothing (the reads that follow are page faults or `pread`s).
    pub fn prefetch_ranges(&self, ranges: &[(u64, u64)]) -> Result<()> {
        match &self.backing {
            #[cfg(feature = "remote")]
            Backing::Remote(object) => object.prefetch(ranges).map_err(crate::remote::error),
            _ => {
                let _ = ranges;
                Ok(())
            }
        }
    }

    /// Ask the kernel to read `[offset, offset + len)` ahead: `MADV_WILLNEED`
    /// on a mapping, `POSIX_FADV_WILLNEED` on a positional file (the page
    /// cache both read from). The kernel queues the reads and returns.
    pub fn prefetch(&self, offset: u64, len: u64) -> Result<()> {
        if let Backing::Positional(file) = &self.backing {
            use std::os::fd::AsRawFd;
            let len = len.min(self.len.saturating_sub(offset));
            if len == 0 {
                return Ok(());
            }
            // SAFETY: fadvise only reads the descriptor it is given; the
            // file stays open for the call. Advice never changes the bytes.
            let rc = unsafe {
                libc::posix_fadvise(
                    file.as_raw_fd(),
                    offset as libc::off_t,
                    len as libc::off_t,
                    libc::POSIX_FADV_WILLNEED,
                )
            };
            if rc != 0 {
                return Err(Error::Io {
                    ctx: self.ctx().at(offset),
                    source: std::io::Error::from_raw_os_error(rc),
                });
            }
            return Ok(());
        }
        self.advise(offset, len, libc::MADV_WILLNEED)
    }

    /// Read `[offset, offset + len)` into the page cache now, through the
    /// kernel's own readahead: `MADV_POPULATE_READ` on a mapping (faults
    /// taken in order, as a sequential reader takes them, so the kernel
    /// reads ahead in large folios), `pread` into a scratch buffer on a
    /// positional file (what `cat` does). Returns when the bytes are
    /// cached. Unlike `WILLNEED` advice, which this kernel caps at one
    /// readahead window per call and fills with small pages, this reads at
    /// the device's sequential speed.
    pub fn populate(&self, offset: u64, len: u64) -> Result<()> {
        if len == 0 || offset >= self.len {
            return Ok(());
        }
        let len = len.min(self.len - offset);
        match &self.backing {
            Backing::Mapped(map) => {
                let (start, end) = Self::page_envelope(offset, len);
                populate_mapping(map.as_ptr(), start, end.min(map.len() as u64));
                Ok(())
            }
            Backing::Positional(file) => {
                const PIECE: u64 = 8 << 20;
                let mut buf = crate::buffer::try_zeroed(
                    &self.ctx().at(offset),
                    "a read buffer",
                    len.min(PIECE + page_size()),
                )?;
                let mut at = offset;
                while at < offset + len {
                    let n = read_piece_len(at, offset + len - at, PIECE) as usize;
                    file.read_exact_at(&mut buf[..n], at)
                        .map_err(|e| self.read_failed(file, at, n as u64, e))?;
                    at += n as u64;
                }
                Ok(())
            }
            #[cfg(feature = "remote")]
            Backing::Remote(_) => Ok(()),
            Backing::Memory(_) => Ok(()),
        }
    }

    /// Whether `[offset, offset + len)` looks wholly cached, from a few
    /// evenly spaced probes of `PROBE` bytes (its first and last pages
    /// among them), each one `cachestat` call: a whole load asks this
    /// before [`Store::uncached_ranges`], whose exact count walks every
    /// page of the range (most of a warm load's own time at 256 MiB). A
    /// range that looks cached but is not (pages evicted between the
    /// probes) is still read correctly, by the faults of the pages touched;
    /// only the batched read-in is skipped. False for stores that cannot
    /// tell.
    pub fn looks_cached(&self, offset: u64, len: u64) -> bool {
        if len == 0 || offset >= self.len {
            return true;
        }
        let (start, end) = Self::page_envelope(offset, len.min(self.len - offset));
        let end = end.min(self.len);
        let page = page_size();
        let span = end - start;
        (0..PROBES).all(|i| {
            // Probe i starts i/(PROBES-1) of the way in (on a page); the
            // last one runs to the range's end, its partial page included.
            let at = start + (span.saturating_sub(PROBE) * i / (PROBES - 1)) / page * page;
            let stop = if i == PROBES - 1 {
                end
            } else {
                (at + PROBE).min(end)
            };
            self.cached_pages(at, stop) == Some((stop - at).div_ceil(page))
        })
    }

    /// The parts of `[offset, offset + len)` whose pages the page cache
    /// does not hold, as page-aligned ranges, runs closer than `gap`
    /// joined: what a whole load still has to read. A warm load then costs
    /// no populate at all, only the faults of the pages it touches. Asked
    /// of `cachestat` first (one count over the range, walking the cache's
    /// folios in order; `mincore` looks each page up on its own, which
    /// made it most of a warm load's cost), halving a range it finds partly
    /// cached down to 2 MiB, which `mincore` then maps page by page. Stores
    /// that cannot tell (positional, remote, or both calls failing) report
    /// the whole range.
    pub fn uncached_ranges(&self, offset: u64, len: u64, gap: u64) -> Vec<(u64, u64)> {
        if len == 0 || offset >= self.len {
            return Vec::new();
        }
        let (start, end) = Self::page_envelope(offset, len.min(self.len - offset));
        let Backing::Mapped(map) = &self.backing else {
            return vec![(start, end)];
        };
        let end = end.min(map.len() as u64);
        let mut runs: Vec<(u64, u64)> = Vec::new();
        self.uncached_within(map, start, end, &mut runs);
        let mut joined: Vec<(u64, u64)> = Vec::with_capacity(runs.len());
        for (s, e) in runs {
            match joined.last_mut() {
                Some(last) if s <= last.1 + gap => last.1 = e,
                _ => joined.push((s, e)),
            }
        }
        joined
    }

    /// [`Store::uncached_ranges`] of the page-aligned `[start, end)`,
    /// appended to `runs` in order (unjoined).
    fn uncached_within(
        &self,
        map: &memmap2::Mmap,
        start: u64,
        end: u64,
        runs: &mut Vec<(u64, u64)>,
    ) {
        const SPLIT: u64 = 2 << 20;
        let page = page_size();
        match self.cached_pages(start, end) {
            Some(cached) if cached >= (end - start).div_ceil(page) => return,
            Some(0) => return runs.push((start, end)),
            Some(_) if end - start > SPLIT => {
                let mid = start + (end - start) / 2 / page * page;
                self.uncached_within(map, start, mid, runs);
                self.uncached_within(map, mid, end, runs);
                return;
            }
            _ => {}
        }
        let mut resident = vec![0u8; (end - start).div_ceil(page) as usize];
        // SAFETY: [start, end) lies inside the mapping (start page-aligned,
        // end clamped to its length) and `resident` has a byte per page;
        // mincore only reports residency.
        let rc = unsafe {
            libc::mincore(
                map.as_ptr().add(start as usize) as *mut libc::c_void,
                (end - start) as usize,
                resident.as_mut_ptr(),
            )
        };
        if rc != 0 {
            return runs.push((start, end));
        }
        for (i, _) in resident.iter().enumerate().filter(|(_, r)| **r & 1 == 0) {
            let p = start + i as u64 * page;
            let e = (p + page).min(end);
            match runs.last_mut() {
                Some(last) if last.1 == p => last.1 = e,
                _ => runs.push((p, e)),
            }
        }
    }

    /// How many pages of `[start, end)` the page cache holds, by
    /// `cachestat(2)` on the store's descriptor (Linux 6.5); `None` where
    /// the kernel lacks it or the store holds no descriptor.
    fn cached_pages(&self, start: u64, end: u64) -> Option<u64> {
        use std::os::fd::AsRawFd;
        /// `cachestat`'s number, the same on every architecture.
        const SYS_CACHESTAT: libc::c_long = 451;
        #[repr(C)]
        struct Range {
            off: u64,
            len: u64,
        }
        #[repr(C)]
        #[derive(Default)]
        struct Stat {
            nr_cache: u64,
            nr_dirty: u64,
            nr_writeback: u64,
            nr_evicted: u64,
            nr_recently_evicted: u64,
        }
        let file = self.file.as_ref()?;
        let range = Range {
            off: start,
            len: end - start,
        };
        let mut stat = Stat::default();
        // SAFETY: cachestat reads `range` and writes `stat`, both live
        // `repr(C)` values of the kernel's layout, on a descriptor this
        // store owns; it changes nothing.
        let rc = unsafe {
            libc::syscall(
                SYS_CACHESTAT,
                file.as_raw_fd(),
                &range as *const Range,
                &mut stat as *mut Stat,
                0u32,
            )
        };
        (rc == 0).then_some(stat.nr_cache)
    }

    /// Drop the pages `[start, end)` from this process's view of the cache
    /// (`MADV_DONTNEED`). `start` and `end` must be page-aligned; callers
    /// decide which pages are safe to drop (see `Source::evict`).
    pub fn evict_pages(&self, start: u64, end: u64) -> Result<()> {
        let page = page_size();
        if start % page != 0 || (end % page != 0 && end != self.len) || end < start {
            return Err(Error::Unsupported {
                rule: Rule::ACCESS_PAGES,
                ctx: self.ctx().at(start),
                reason: format!("evict range {start}..{end} is not page-aligned"),
            });
        }
        self.advise(start, end - start, libc::MADV_DONTNEED)
    }

    pub(super) fn advise(&self, offset: u64, len: u64, advice: libc::c_int) -> Result<()> {
        let Backing::Mapped(map) = &self.backing else {
            return Ok(());
        };
        if len == 0 || offset >= self.len {
            return Ok(());
        }
        let (start, end) = Self::page_envelope(offset, len.min(self.len - offset));
        let end = end.min(map.len() as u64);
        if end <= start {
            return Ok(());
        }
        // SAFETY: [start, end) lies inside the mapping (start is page-aligned
        // and below len; end is clamped to the mapping length). madvise with
        // WILLNEED/DONTNEED/RANDOM/NORMAL on a read-only shared file mapping
        // never changes the bytes a reader sees: DONTNEED only drops pages,
        // which the next access faults back in from the file; the others
        // change how much is read ahead.
        let rc = unsafe {
            libc::madvise(
                map.as_ptr().add(start as usize) as *mut libc::c_void,
                (end - start) as usize,
                advice,
            )
        };
        if rc != 0 {
            return Err(Error::Io {
                ctx: self.ctx().at(start),
                source: std::io::Error::last_os_error(),
            });
        }
        Ok(())
    }
}

/// Fault in the pages `[start, end)` of the mapping at `base` as reads
/// (`MADV_POPULATE_READ`: faults taken in order, as a sequential reader
/// takes them, so the kernel reads ahead in large folios). Callers pass a
/// page-aligned `start` and an `end` within the mapping.
pub(super) fn populate_mapping(base: *const u8, start: u64, end: u64) {
    if end <= start {
        return;
    }
    // SAFETY: [start, end) lies inside the mapping (the callers' contract);
    // populating for reading only faults in pages of a file mapping, never
    // changing a byte (a private mapping's read faults copy nothing).
    let rc = unsafe {
        libc::madvise(
            base.add(start as usize) as *mut libc::c_void,
            (end - start) as usize,
            libc::MADV_POPULATE_READ,
        )
    };
    if rc != 0 {
        // Kernels before 5.14 lack it: touch one byte per page in order
        // instead (the same faults).
        let page = page_size() as usize;
        let mut acc = 0u8;
        for i in (start as usize..end as usize).step_by(page) {
            // SAFETY: i lies inside the mapping (the callers' contract).
            acc ^= unsafe { std::ptr::read_volatile(base.add(i)) };
        }
        std::hint::black_box(acc);
    }
}
