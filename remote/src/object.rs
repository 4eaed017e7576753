//! [`RemoteObject`]: one object read by ranged GETs, pinned to the version
//! it had when opened.
//!
//! Opening sends two concurrent GETs: the first [`HEAD_BYTES`] (its
//! `Content-Range` gives the size and the response the ETag, so no HEAD
//! request is needed) and the last [`TAIL_BYTES`] (footers, zip central
//! directories, and what format detection reads of a file's end). An
//! object that is never format-detected and read from its head (`meta.zr`,
//! JSON) is opened by its head alone, and one whose size this process
//! knows (a listing, an earlier open) by ranges planned on it: a small one
//! in one GET of all of it, so no byte comes twice. The probes' bytes land
//! in a small cache of byte extents that serves the structure walks of
//! every format; a small read the cache misses fetches
//! the aligned [`BLOCK`] around it. Large reads are split into parts
//! fetched in parallel straight into the destination buffer. Every request
//! after the first carries `If-Match` with the ETag (or, from a server
//! without ETags, `If-Unmodified-Since`), so an object replaced during a
//! read fails with [`ErrorKind::Changed`] instead of mixing two versions;
//! and since a server may ignore those headers, every response's ETag (or
//! Last-Modified) and size are compared with the version opened before a
//! byte of its body is used. A body is read into a buffer of the range
//! asked for and no further: one longer or shorter is
//! [`ErrorKind::BadResponse`]. A read part of which the cache holds (at
//! its start or end: bytes of the head or tail) fetches only the rest.
//!
//! What opening fetched can be recorded and replayed in another process
//! ([`crate::openings`]): an object opened from a replay sends no request
//! to open and is pinned to the recorded version.

use std::sync::{Arc, Mutex};
use std::time::Instant;

use bytes::Bytes;
use chrono::{DateTime, Utc};
use futures::{Stream, StreamExt, TryStreamExt};
use object_store::{GetOptions, GetRange, ObjectMeta, ObjectStore, ObjectStoreExt};

use crate::config::RemoteConfig;
use crate::error::{Error, ErrorKind, Result};
use crate::fetch::{budget_for, Budget};
use crate::link::{link_for, Link};
use crate::openings::{self, Recorded};
use crate::plan::{plan, Fetch};
use crate::runtime::{block_on, block_on_store, stats, store_for, Stats};
use crate::url::{ObjectUrl, Scheme};
use crate::watch;

/// Bytes fetched from the start of an object when it is opened.
pub const HEAD_BYTES: u64 = 1 << 20;
/// Bytes fetched from the end of an object when it is opened.
pub const TAIL_BYTES: u64 = 256 << 10;
/// A small read that misses the cache fetches the aligned block around it.
pub const BLOCK: u64 = 256 << 10;
/// The most bytes the extent cache of one object holds.
pub const CACHE_BYTES: u64 = 32 << 20;

/// Byte extents already fetched, least recently used evicted first.
#[derive(Debug, Default)]
pub(crate) struct ExtentCache {
    extents: Vec<(u64, Bytes, u64)>,
    bytes: u64,
    tick: u64,
}

impl ExtentCache {
    fn get(&mut self, offset: u64, len: u64) -> Option<&[u8]> {
        self.tick += 1;
        let tick = self.tick;
        let hit = self.extents.iter_mut().find(|(start, data, _)| {
            *start <= offset && offset + len <= start + data.len() as u64
        })?;
        hit.2 = tick;
        let at = (offset - hit.0) as usize;
        Some(&hit.1[at..at + len as usize])
    }

    /// Copy into `out` (the bytes of `[offset, offset + out.len())`) what
    /// the cache holds of its start and of its end, each from one extent;
    /// returns how many bytes of each (together at most `out.len()`).
    fn copy_ends(&mut self, offset: u64, out: &mut [u8]) -> (usize, usize) {
        self.tick += 1;
        let tick = self.tick;
        let len = out.len() as u64;
        let end = offset + len;
        let (mut head, mut tail) = (0u64, 0u64);
        for (start, data, used) in self.extents.iter_mut() {
            let stop = *start + data.len() as u64;
            if *start <= offset && offset < stop && stop.min(end) - offset > head {
                head = stop.min(end) - offset;
                out[..head as usize]
                    .copy_from_slice(&data[(offset - *start) as usize..][..head as usize]);
                *used = tick;
            }
        }
        for (start, data, used) in self.extents.iter_mut() {
            let stop = *start + data.len() as u64;
            let from = (*start).max(offset + head);
            if from < end && end <= stop && end - from > tail {
                tail = end - from;
                let at = (len - tail) as usize;
                out[at..].copy_from_slice(&data[(from - *start) as usize..][..tail as usize]);
                *used = tick;
            }
        }
        (head as usize, tail as usize)
    }

    /// Every extent held, in no particular order (what a recording of the
    /// opening carries to other processes).
    pub(crate) fn extents(&self) -> Vec<(u64, Bytes)> {
        self.extents
            .iter()
            .map(|(start, data, _)| (*start, data.clone()))
            .collect()
    }

    pub(crate) fn insert(&mut self, start: u64, data: Bytes) {
        self.tick += 1;
        self.bytes += data.len() as u64;
        self.extents.push((start, data, self.tick));
        while self.bytes > CACHE_BYTES && self.extents.len() > 1 {
            let oldest = (0..self.extents.len() - 1)
                .min_by_key(|&i| self.extents[i].2)
                .expect("more than one extent");
            let (_, gone, _) = self.extents.swap_remove(oldest);
            self.bytes -= gone.len() as u64;
        }
    }
}

/// What pins every request after the first to the version opened.
#[derive(Debug, Clone)]
pub(crate) enum Version {
    /// `If-Match` with the ETag.
    ETag(String),
    /// `If-Unmodified-Since`, from a server that gives no ETag.
    Modified(DateTime<Utc>),
}

/// Whether two ETags name the same version. Compared without their quotes:
/// some S3-compatible servers quote the ETags of a listing (what
/// [`RemoteObject::listed`] pins) differently from those of a GET.
fn same_etag(a: &str, b: &str) -> bool {
    a.trim_matches('"') == b.trim_matches('"')
}

impl Version {
    /// The version a response names: its ETag, else its Last-Modified.
    fn of(meta: &ObjectMeta) -> Version {
        match &meta.e_tag {
            Some(tag) => Version::ETag(tag.clone()),
            None => Version::Modified(meta.last_modified),
        }
    }

    /// Fail with [`ErrorKind::Changed`] unless `meta`, one response's,
    /// names this version of an object of `size` bytes. The preconditions
    /// every request carries are not enough: a server (or a cache in front
    /// of it) that ignores them answers with another version's bytes, which
    /// would be mixed silently with those already read.
    fn confirm(&self, url: &str, size: u64, meta: &ObjectMeta) -> Result<()> {
        let mismatch = match self {
            Version::ETag(tag) => match &meta.e_tag {
                Some(seen) if same_etag(tag, seen) => None,
                Some(seen) => Some(format!(
                    "ETag mismatch: opened {tag}, the server sent {seen}"
                )),
                None => Some(format!("ETag mismatch: opened {tag}, the server sent none")),
            },
            Version::Modified(stamp) if meta.last_modified != *stamp => Some(format!(
                "Last-Modified mismatch: opened {}, the server sent {}",
                stamp.to_rfc2822(),
                meta.last_modified.to_rfc2822()
            )),
            Version::Modified(_) => None,
        };
        let mismatch = mismatch.or_else(|| {
            (meta.size != size).then(|| {
                format!(
                    "size mismatch: opened {size} bytes, the server reports {}",
                    meta.size
                )
            })
        });
        match mismatch {
            None => Ok(()),
            Some(why) => Err(Error::new(
                ErrorKind::Changed,
                url,
                format!("the object changed while it was read ({why})"),
            )),
        }
    }
}

/// One object of an S3-compatible store or an HTTP server.
#[derive(Debug)]
pub struct RemoteObject {
    url: ObjectUrl,
    config: Arc<RemoteConfig>,
    size: u64,
    version: Version,
    /// Shared with a live [`openings::Recording`], which reads it when it
    /// finishes.
    cache: Arc<Mutex<ExtentCache>>,
    /// What a request to this object's store costs (the coalescing gap).
    link: Arc<Link>,
    /// What admits each request ([`crate::fetch`]).
    budget: Arc<Budget>,
}

/// A zeroed buffer of `len` bytes for a read whose size the file declares:
/// an allocation the process cannot get is [`ErrorKind::Memory`], not an
/// abort.
fn zeroed(url: &str, len: u64) -> Result<Vec<u8>> {
    let mut buf = Vec::new();
    usize::try_from(len)
        .ok()
        .and_then(|n| buf.try_reserve_exact(n).ok().map(|()| n))
        .map(|n| buf.resize(n, 0))
        .ok_or_else(|| Error::memory(url, len))?;
    Ok(buf)
}

/// Copy a response's body into `buf`, which is exactly the range
/// `start..start + buf.len()` asked for. The body is never buffered beyond
/// that: a chunk reaching past it ends the read (dropping the stream closes
/// the connection), so a server announcing or sending gigabytes for a small
/// range costs one chunk. A body ending short is refused too.
async fn read_body<S>(mut body: S, url: &str, start: u64, buf: &mut [u8]) -> Result<()>
where
    S: Stream<Item = object_store::Result<Bytes>> + Unpin,
{
    let end = start + buf.len() as u64;
    let mut at = 0usize;
    while let Some(chunk) = body.next().await {
        let chunk = chunk.map_err(|e| Error::from_store(url, e))?;
        let Some(dest) = buf.get_mut(at..at + chunk.len()) else {
            return Err(Error::new(
                ErrorKind::BadResponse,
                url,
                format!("the body of bytes {start}..{end} is longer than the range"),
            ));
        };
        dest.copy_from_slice(&chunk);
        at += chunk.len();
        Stats::count(&stats().bytes_in, chunk.len() as u64);
    }
    if at != buf.len() {
        return Err(Error::new(
            ErrorKind::BadResponse,
            url,
            format!("short body: {at} of {} bytes of {start}..{end}", buf.len()),
        ));
    }
    Ok(())
}

/// Names of objects read from their head and never format-detected (which
/// looks at a file's last bytes too): a zrecord store's `meta.zr`, JSON
/// manifests and indexes, zarr v2 metadata. Opening one asks for its head
/// alone, so a small one (most are) comes whole in one GET and a large
/// one's open spends no bytes on a tail. A name that lies costs its reader
/// one more request, never a wrong byte.
const HEAD_ONLY_SUFFIXES: &[&str] = &[
    "/meta.zr",
    ".json",
    "/.zarray",
    "/.zgroup",
    "/.zattrs",
    "/.zmetadata",
];

/// The sizes of objects this process has opened or listed, by URL, so a
/// later open plans its probes on the size ([`RemoteObject::open_sized`]):
/// a small object opened again (each epoch's `meta.zr`, a file opened
/// twice) is fetched once, whole. A stale size costs that open a request,
/// never a wrong byte: every response names the object's size and version.
mod sizes {
    use std::collections::HashMap;
    use std::sync::{Mutex, OnceLock};

    /// At most this many sizes are kept; past it the memo starts afresh.
    const MOST: usize = 4096;

    fn memo() -> std::sync::MutexGuard<'static, HashMap<String, u64>> {
        static SIZES: OnceLock<Mutex<HashMap<String, u64>>> = OnceLock::new();
        SIZES
            .get_or_init(Mutex::default)
            .lock()
            .unwrap_or_else(|p| p.into_inner())
    }

    pub(super) fn recalled(url: &str) -> Option<u64> {
        memo().get(url).copied()
    }

    pub(super) fn remember(url: &str, size: u64) {
        let mut memo = memo();
        if memo.len() >= MOST && !memo.contains_key(url) {
            memo.clear();
        }
        memo.insert(url.to_string(), size);
    }

    pub(super) fn forget(url: &str) {
        memo().remove(url);
    }
}

/// Whether opening `key` needs its tail (see [`HEAD_ONLY_SUFFIXES`]).
fn wants_tail(key: &str) -> bool {
    let key = format!("/{key}");
    !HEAD_ONLY_SUFFIXES.iter().any(|s| key.ends_with(s))
}

/// The most bytes an opening probe asks for.
const PROBE_BYTES: u64 = if HEAD_BYTES > TAIL_BYTES {
    HEAD_BYTES
} else {
    TAIL_BYTES
};

/// The body of a GET whose range the server chose within `range` (open's
/// probes), with the response's metadata and the offset it starts at.
async fn fetch_probe(
    store: &dyn ObjectStore,
    url: &ObjectUrl,
    range: GetRange,
    (budget, link): (&Budget, &Link),
) -> Result<(ObjectMeta, u64, Bytes)> {
    let most = match &range {
        GetRange::Bounded(r) => r.end - r.start,
        _ => PROBE_BYTES,
    };
    let _admitted = budget.admit(most).await;
    watch::scoped(fetch_probe_once(store, url, range, most, link)).await
}

async fn fetch_probe_once(
    store: &dyn ObjectStore,
    url: &ObjectUrl,
    range: GetRange,
    most: u64,
    link: &Link,
) -> Result<(ObjectMeta, u64, Bytes)> {
    Stats::count(&stats().gets, 1);
    let options = GetOptions {
        range: Some(range),
        ..GetOptions::default()
    };
    let sent = Instant::now();
    let result = store
        .get_opts(&url.path(), options)
        .await
        .map_err(|e| Error::from_store(&url.text, e))?;
    let head = Instant::now();
    let (meta, start, len) = (
        result.meta.clone(),
        result.range.start,
        result.range.end - result.range.start,
    );
    // object_store matched the Content-Range against the request, so this
    // holds; checked here because it sizes the buffer.
    if len > most {
        return Err(Error::new(
            ErrorKind::BadResponse,
            &url.text,
            format!("asked for at most {most} bytes, the server sent {len}"),
        ));
    }
    let mut body = vec![0u8; len as usize];
    read_body(result.into_stream(), &url.text, start, &mut body).await?;
    link.record(head - sent, len, head.elapsed());
    Ok((meta, start, Bytes::from(body)))
}

impl RemoteObject {
    /// Open the object at `url`: size and version from ranged GETs of its
    /// head and tail sent together (planned on its size when this process
    /// has learnt it: [`RemoteObject::open_sized`]), which also fill the
    /// cache.
    pub fn open(url: &str, config: Arc<RemoteConfig>) -> Result<RemoteObject> {
        RemoteObject::open_planned(url, config, None)
    }

    /// Open the object at `url` whose size a listing gave: its probes are
    /// planned on that size, so an object its head and tail would both
    /// cover is fetched once, whole, in one GET, and a larger one's tail is
    /// a bounded range sent with its head (on Azure too). An object whose
    /// size has changed since is opened still, at the cost of a request.
    pub fn open_sized(url: &str, config: Arc<RemoteConfig>, size: u64) -> Result<RemoteObject> {
        RemoteObject::open_planned(url, config, Some(size))
    }

    fn open_planned(
        url: &str,
        config: Arc<RemoteConfig>,
        given: Option<u64>,
    ) -> Result<RemoteObject> {
        let url = ObjectUrl::parse(url)?;
        if url.key.is_empty() || url.key.ends_with('/') {
            return Err(Error::new(
                ErrorKind::Config,
                &url.text,
                "names a bucket or prefix, not an object",
            ));
        }
        if let Some(recorded) = openings::replayed(&url.text) {
            return RemoteObject::replayed(url, config, &recorded);
        }
        let text = url.text.clone();
        let known = given.or_else(|| sizes::recalled(&text)).filter(|&n| n > 0);
        let mut opened = RemoteObject::fetch_open(url.clone(), Arc::clone(&config), known);
        if known.is_some() && matches!(&opened, Err(e) if e.kind != ErrorKind::NotFound) {
            // The size learnt may be stale (a bounded tail past a shrunk
            // object's end): open it as an object of unknown size.
            opened = RemoteObject::fetch_open(url, config, None);
        }
        match &opened {
            Ok(object) => {
                sizes::remember(&text, object.size);
                openings::note_found(&text, object.size, &object.version, &object.cache)
            }
            Err(e) if e.kind == ErrorKind::NotFound => {
                sizes::forget(&text);
                openings::note_missing(&text)
            }
            Err(_) => {}
        }
        opened
    }

    /// An object as a replayed recording found it (no request sent).
    fn replayed(
        url: ObjectUrl,
        config: Arc<RemoteConfig>,
        recorded: &Recorded,
    ) -> Result<RemoteObject> {
        let (size, version, extents) = match recorded {
            Recorded::Missing => {
                return Err(Error::new(
                    ErrorKind::NotFound,
                    &url.text,
                    "not found (by the process that opened it for this one)",
                ))
            }
            Recorded::Found {
                size,
                version,
                extents,
            } => (*size, version.clone(), extents),
        };
        let mut cache = ExtentCache::default();
        for (start, data) in extents {
            cache.insert(*start, data.clone());
        }
        let object = RemoteObject {
            link: link_for(&url, &config),
            budget: budget_for(&config),
            url,
            config,
            size,
            version,
            cache: Arc::new(Mutex::new(cache)),
        };
        openings::note_found(object.url(), size, &object.version, &object.cache);
        Ok(object)
    }

    /// Open by the probes (see [`RemoteObject::open`]), planned on `known`,
    /// the size a listing gave, if any.
    fn fetch_open(
        url: ObjectUrl,
        config: Arc<RemoteConfig>,
        known: Option<u64>,
    ) -> Result<RemoteObject> {
        let store = store_for(&url, &config)?;
        let (link, budget) = (link_for(&url, &config), budget_for(&config));
        let wire = (budget.as_ref(), link.as_ref());
        let wants_tail = wants_tail(&url.key);
        // With the size known, the head covers a small object whole and the
        // tail is a bounded range; without it, the tail is a suffix range
        // sent with the head (one round trip), except on Azure Blob
        // Storage, which has no suffix ranges: there the tail is asked for
        // once the head's response gave the size (two round trips, for
        // objects past the head only).
        let (head_range, tail_range) = match known {
            Some(size) if size <= HEAD_BYTES + TAIL_BYTES => (GetRange::Bounded(0..size), None),
            Some(_) if !wants_tail => (GetRange::Bounded(0..HEAD_BYTES), None),
            Some(size) => (
                GetRange::Bounded(0..HEAD_BYTES),
                Some(GetRange::Bounded(size - TAIL_BYTES..size)),
            ),
            None if wants_tail && url.scheme != Scheme::Azure => (
                GetRange::Bounded(0..HEAD_BYTES),
                Some(GetRange::Suffix(TAIL_BYTES)),
            ),
            None => (GetRange::Bounded(0..HEAD_BYTES), None),
        };
        let (head, tail) = if let Some(tail_range) = tail_range {
            let (head, tail) = block_on(futures::future::join(
                fetch_probe(store.as_ref(), &url, head_range, wire),
                fetch_probe(store.as_ref(), &url, tail_range, wire),
            ))?;
            (head, Some(tail))
        } else {
            (
                block_on(fetch_probe(store.as_ref(), &url, head_range, wire))?,
                None,
            )
        };
        let (meta, head) = match head {
            Ok((meta, start, body)) => (meta, Some((start, body))),
            // An empty object has no byte 0 to range over: ask for its size.
            Err(e) if e.kind == ErrorKind::BadResponse => {
                Stats::count(&stats().heads, 1);
                let meta = block_on_store(&url.text, store.head(&url.path()))?;
                if meta.size != 0 {
                    return Err(e);
                }
                (meta, None)
            }
            Err(e) => return Err(e),
        };
        let version = Version::of(&meta);
        let mut cache = ExtentCache::default();
        if let Some((start, body)) = head {
            cache.insert(start, body);
        }
        // What the head probe asked for: all of an object up to that size
        // came with it.
        let head_most = match known {
            Some(size) if size <= HEAD_BYTES + TAIL_BYTES => size,
            _ => HEAD_BYTES,
        };
        let tail = match tail {
            Some(tail) => tail,
            None if wants_tail && meta.size > head_most => {
                let start = meta.size.saturating_sub(TAIL_BYTES).max(HEAD_BYTES);
                block_on(fetch_probe(
                    store.as_ref(),
                    &url,
                    GetRange::Bounded(start..meta.size),
                    wire,
                ))?
            }
            // The head holds the whole object.
            None => Ok((meta.clone(), 0, Bytes::new())),
        };
        match tail {
            Ok((tail_meta, start, body)) if meta.size > 0 => {
                version.confirm(&url.text, meta.size, &tail_meta)?;
                if start + body.len() as u64 > HEAD_BYTES {
                    cache.insert(start, body);
                }
            }
            Ok(_) => {}
            Err(_) if meta.size == 0 => {}
            Err(e) => return Err(e),
        }
        Ok(RemoteObject {
            url,
            config,
            size: meta.size,
            version,
            cache: Arc::new(Mutex::new(cache)),
            link,
            budget,
        })
    }

    /// An object whose size and ETag a listing already gave: no request is
    /// sent until it is read, and every read is pinned to `etag`.
    pub fn listed(
        url: &str,
        config: Arc<RemoteConfig>,
        size: u64,
        etag: String,
    ) -> Result<RemoteObject> {
        let url = ObjectUrl::parse(url)?;
        sizes::remember(&url.text, size);
        Ok(RemoteObject {
            link: link_for(&url, &config),
            budget: budget_for(&config),
            url,
            config,
            size,
            version: Version::ETag(etag),
            cache: Arc::new(Mutex::new(ExtentCache::default())),
        })
    }

    /// The object's URL.
    pub fn url(&self) -> &str {
        &self.url.text
    }

    /// The object's size in bytes.
    pub fn len(&self) -> u64 {
        self.size
    }

    /// True for an empty object.
    pub fn is_empty(&self) -> bool {
        self.size == 0
    }

    /// The ETag every read is pinned to, if the server gave one.
    pub fn etag(&self) -> Option<&str> {
        match &self.version {
            Version::ETag(tag) => Some(tag),
            _ => None,
        }
    }

    /// A string naming the version opened: the ETag, else the size and
    /// last-modified stamp (what the local cache keys entries by).
    pub fn version_key(&self) -> String {
        match &self.version {
            Version::ETag(tag) => tag.clone(),
            Version::Modified(stamp) => format!("{}@{}", self.size, stamp.to_rfc3339()),
        }
    }

    /// The configuration this object was opened with.
    pub fn config(&self) -> &Arc<RemoteConfig> {
        &self.config
    }

    fn check(&self, offset: u64, len: u64) -> Result<()> {
        match offset.checked_add(len) {
            Some(end) if end <= self.size => Ok(()),
            _ => Err(Error::new(
                ErrorKind::BadResponse,
                &self.url.text,
                format!(
                    "range {offset}+{len} is outside the object's {} bytes",
                    self.size
                ),
            )),
        }
    }

    fn cached(&self, offset: u64, len: u64) -> Option<Vec<u8>> {
        let mut cache = self.cache.lock().unwrap_or_else(|p| p.into_inner());
        cache.get(offset, len).map(<[u8]>::to_vec)
    }

    /// Bytes `[offset, offset + len)`. Small reads go through the extent
    /// cache (a miss fetches the aligned block around the read); large
    /// reads are fetched in parallel parts.
    pub fn read(&self, offset: u64, len: u64) -> Result<Vec<u8>> {
        self.check(offset, len)?;
        if len == 0 {
            return Ok(Vec::new());
        }
        if let Some(hit) = self.cached(offset, len) {
            return Ok(hit);
        }
        if len > BLOCK {
            let mut out = zeroed(&self.url.text, len)?;
            self.read_into(offset, &mut out)?;
            return Ok(out);
        }
        let start = offset / BLOCK * BLOCK;
        let end = (offset + len)
            .div_ceil(BLOCK)
            .saturating_mul(BLOCK)
            .min(self.size);
        let mut block = vec![0u8; (end - start) as usize];
        self.run(vec![(start, &mut block[..])], 1)?;
        let at = (offset - start) as usize;
        let out = block[at..at + len as usize].to_vec();
        self.cache
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(start, Bytes::from(block));
        Ok(out)
    }

    /// Fill `buf` with bytes from `offset`, in parallel parts (sized for
    /// the read and the link, [`Link::read_part`]), `concurrency` at a time
    /// (and within the budget).
    pub fn read_into(&self, offset: u64, buf: &mut [u8]) -> Result<()> {
        let len = buf.len() as u64;
        self.check(offset, len)?;
        if let Some(hit) = self.cached(offset, len) {
            buf.copy_from_slice(&hit);
            return Ok(());
        }
        let part = self.read_part(len) as usize;
        let jobs: Vec<(u64, &mut [u8])> = buf
            .chunks_mut(part.max(1))
            .enumerate()
            .map(|(i, chunk)| (offset + (i * part) as u64, chunk))
            .collect();
        self.run(jobs, self.config.concurrency)
    }

    /// The part size of a read of `total` bytes of this object.
    fn read_part(&self, total: u64) -> u64 {
        self.link.read_part(&self.config, total)
    }

    /// The coalescing gap and amplification bound reads of this object
    /// are planned with.
    fn coalescing(&self) -> (u64, u32) {
        (
            self.link.coalesce_gap(&self.config),
            self.config.max_amplification,
        )
    }

    /// Read several ranges at once: each is served from the cache when it
    /// can be, and what the cache holds of its start or end is taken from
    /// it; the rest are planned ([`crate::plan`]: large ranges split,
    /// small neighbours coalesced) and fetched concurrently, as many in
    /// flight as the budget admits.
    pub fn read_ranges(&self, ranges: &[(u64, u64)]) -> Result<Vec<Vec<u8>>> {
        block_on(self.fetch_ranges(ranges))?
    }

    /// [`RemoteObject::read_ranges`] as a future, for a caller that fetches
    /// several objects' ranges together (a record store's shards) or starts
    /// the work now and collects it later ([`crate::fetch::spawn`]).
    pub async fn fetch_ranges(&self, ranges: &[(u64, u64)]) -> Result<Vec<Vec<u8>>> {
        for &(offset, len) in ranges {
            self.check(offset, len)?;
        }
        let mut outs: Vec<Vec<u8>> = Vec::with_capacity(ranges.len());
        // What is left to fetch of each read, as an object range and as
        // the span of its output buffer the bytes go to.
        let mut todo: Vec<(u64, u64)> = Vec::with_capacity(ranges.len());
        let mut spans: Vec<(usize, usize)> = Vec::with_capacity(ranges.len());
        for &(offset, len) in ranges {
            let mut out = zeroed(&self.url.text, len)?;
            let (head, tail) = if len == 0 {
                (0, 0)
            } else {
                let mut cache = self.cache.lock().unwrap_or_else(|p| p.into_inner());
                cache.copy_ends(offset, &mut out)
            };
            let stop = out.len() - tail;
            todo.push((offset + head as u64, (stop - head) as u64));
            spans.push((head, stop));
            outs.push(out);
        }
        let (gap, amplification) = self.coalescing();
        let part = self.read_part(todo.iter().map(|&(_, len)| len).sum());
        let fetches = plan(&todo, part, gap, amplification);
        let mut shared: Vec<(u64, Vec<u8>, Vec<usize>)> = Vec::new();
        let mut into: Vec<(usize, u64, u64, u64)> = Vec::new();
        for f in fetches {
            match f {
                Fetch::Into {
                    read,
                    at,
                    start,
                    end,
                } => into.push((read, at, start, end)),
                Fetch::Shared { start, end, reads } => {
                    shared.push((start, vec![0u8; (end - start) as usize], reads))
                }
            }
        }
        {
            // Hand each fetch its own disjoint buffer: a part of one
            // output's span, or a shared buffer.
            let mut chunks: Vec<std::slice::ChunksMut<'_, u8>> = outs
                .iter_mut()
                .zip(&spans)
                .map(|(o, &(from, to))| o[from..to].chunks_mut(part as usize))
                .collect();
            let mut jobs: Vec<(u64, &mut [u8])> = Vec::with_capacity(into.len() + shared.len());
            for &(read, _, start, _) in &into {
                let chunk = chunks[read]
                    .next()
                    .expect("the plan splits reads in part order");
                jobs.push((start, chunk));
            }
            for (start, buf, _) in shared.iter_mut() {
                jobs.push((*start, &mut buf[..]));
            }
            self.run_async(jobs, usize::MAX).await?;
        }
        for (start, buf, reads) in shared {
            for m in reads {
                let (offset, len) = todo[m];
                let (from, to) = spans[m];
                let at = (offset - start) as usize;
                outs[m][from..to].copy_from_slice(&buf[at..at + len as usize]);
            }
        }
        Ok(outs)
    }

    /// Bring `ranges` into the extent cache in one planned batch (small
    /// neighbours coalesced, all requests in flight together), so the small
    /// reads a structure walk makes next are served from memory. Ranges
    /// already cached cost nothing; ranges past the end are clipped.
    pub fn prefetch(&self, ranges: &[(u64, u64)]) -> Result<()> {
        let wanted: Vec<(u64, u64)> = ranges
            .iter()
            .filter(|&&(offset, _)| offset < self.size)
            .map(|&(offset, len)| (offset, len.min(self.size - offset)))
            .filter(|&(offset, len)| len > 0 && self.cached(offset, len).is_none())
            .collect();
        let (gap, amplification) = self.coalescing();
        let mut spans: Vec<(u64, Vec<u8>)> =
            plan(&wanted, self.config.part_size, gap, amplification)
                .into_iter()
                .map(|f| match f {
                    Fetch::Into { start, end, .. } | Fetch::Shared { start, end, .. } => {
                        (start, vec![0u8; (end - start) as usize])
                    }
                })
                .collect();
        self.run(
            spans
                .iter_mut()
                .map(|(start, buf)| (*start, &mut buf[..]))
                .collect(),
            usize::MAX,
        )?;
        let mut cache = self.cache.lock().unwrap_or_else(|p| p.into_inner());
        for (start, buf) in spans {
            cache.insert(start, Bytes::from(buf));
        }
        Ok(())
    }

    /// Fetch `[start, start + buf.len())` into `buf`, pinned to the version
    /// opened, checking that the server sent exactly those bytes of it: one
    /// operation of [`watch`] (a body cut off or stalled is resumed by
    /// object_store from where it stopped, and counted as a retry), sent
    /// once the budget admits it.
    async fn fetch_into(&self, store: &dyn ObjectStore, start: u64, buf: &mut [u8]) -> Result<()> {
        let _admitted = self.budget.admit(buf.len() as u64).await;
        watch::scoped(self.fetch_into_once(store, start, buf)).await
    }

    async fn fetch_into_once(
        &self,
        store: &dyn ObjectStore,
        start: u64,
        buf: &mut [u8],
    ) -> Result<()> {
        let url = &self.url.text;
        let end = start + buf.len() as u64;
        let mut options = GetOptions {
            range: Some(GetRange::Bounded(start..end)),
            ..GetOptions::default()
        };
        match &self.version {
            Version::ETag(tag) => options.if_match = Some(tag.clone()),
            Version::Modified(stamp) => options.if_unmodified_since = Some(*stamp),
        }
        Stats::count(&stats().gets, 1);
        let sent = Instant::now();
        let result = store
            .get_opts(&self.url.path(), options)
            .await
            .map_err(|e| Error::from_store(url, e))?;
        let head = Instant::now();
        // First the version (before a byte of the body lands in `buf`,
        // which may be a cache entry's mapping): a server that ignored
        // `If-Match` and answers from a replaced object of another size
        // sends another range too, and the cause to report is the change.
        self.version.confirm(url, self.size, &result.meta)?;
        if result.range != (start..end) {
            return Err(Error::new(
                ErrorKind::BadResponse,
                url,
                format!(
                    "asked for bytes {start}..{end}, the server sent {:?}",
                    result.range
                ),
            ));
        }
        read_body(result.into_stream(), url, start, buf).await?;
        self.link
            .record(head - sent, buf.len() as u64, head.elapsed());
        Ok(())
    }

    /// Fetch every `(start, buffer)`, blocking this thread: see
    /// [`RemoteObject::run_async`].
    fn run(&self, jobs: Vec<(u64, &mut [u8])>, limit: usize) -> Result<()> {
        if jobs.is_empty() {
            return Ok(());
        }
        block_on(self.run_async(jobs, limit))?
    }

    /// Fetch every `(start, buffer)`, at most `limit` of them in flight and
    /// each admitted by the budget (`usize::MAX`: the budget alone bounds
    /// them).
    async fn run_async(&self, jobs: Vec<(u64, &mut [u8])>, limit: usize) -> Result<()> {
        if jobs.is_empty() {
            return Ok(());
        }
        let store = store_for(&self.url, &self.config)?;
        let limit = limit.clamp(1, jobs.len());
        // The futures made first, then polled: a stream mapping the
        // borrowed buffers through a closure is not `Send` (the closure's
        // signature is not general over their lifetimes), and a gather's
        // future must be, to run on the runtime.
        let store = store.as_ref();
        let requests: Vec<_> = jobs
            .into_iter()
            .map(|(start, buf)| self.fetch_into(store, start, buf))
            .collect();
        futures::stream::iter(requests)
            .buffer_unordered(limit)
            .try_collect::<Vec<()>>()
            .await
            .map(|_| ())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn meta(e_tag: Option<&str>, size: u64, stamp: i64) -> ObjectMeta {
        ObjectMeta {
            location: "k".into(),
            last_modified: DateTime::from_timestamp(stamp, 0).expect("a valid stamp"),
            size,
            e_tag: e_tag.map(str::to_string),
            version: None,
        }
    }

    #[test]
    fn every_response_must_name_the_version_opened() {
        let by_tag = Version::ETag("\"v1\"".into());
        // A listing's unquoted ETag pins the same version as a GET's quoted one.
        by_tag
            .confirm("u", 10, &meta(Some("\"v1\""), 10, 0))
            .unwrap();
        Version::ETag("v1".into())
            .confirm("u", 10, &meta(Some("\"v1\""), 10, 0))
            .unwrap();
        for (tag, size, why) in [
            (Some("\"v2\""), 10, "ETag mismatch"),
            (None, 10, "sent none"),
            (Some("\"v1\""), 11, "size mismatch"),
        ] {
            let e = by_tag.confirm("u", 10, &meta(tag, size, 0)).unwrap_err();
            assert_eq!(e.kind, ErrorKind::Changed);
            assert!(e.to_string().contains(why), "{e}");
        }
        let by_time = Version::of(&meta(None, 10, 1_000));
        by_time.confirm("u", 10, &meta(None, 10, 1_000)).unwrap();
        let e = by_time
            .confirm("u", 10, &meta(None, 10, 2_000))
            .unwrap_err();
        assert_eq!(e.kind, ErrorKind::Changed);
        assert!(e.to_string().contains("Last-Modified mismatch"), "{e}");
    }

    #[test]
    fn a_read_takes_what_the_cache_holds_of_its_ends() {
        let object: Vec<u8> = (0..=255u8).cycle().take(1000).collect();
        let mut cache = ExtentCache::default();
        cache.insert(0, Bytes::copy_from_slice(&object[..100])); // a head
        cache.insert(900, Bytes::copy_from_slice(&object[900..])); // a tail
        cache.insert(40, Bytes::copy_from_slice(&object[40..150])); // reaches further
        let ends = |cache: &mut ExtentCache, offset: u64, len: usize| {
            let mut out = vec![0u8; len];
            let (head, tail) = cache.copy_ends(offset, &mut out);
            assert!(head + tail <= len);
            let at = offset as usize;
            assert_eq!(out[..head], object[at..at + head]);
            assert_eq!(out[len - tail..], object[at + len - tail..at + len]);
            (head, tail)
        };
        assert_eq!(ends(&mut cache, 10, 500), (90, 0));
        assert_eq!(ends(&mut cache, 60, 500), (90, 0)); // the longer of two
        assert_eq!(ends(&mut cache, 800, 200), (0, 100));
        assert_eq!(ends(&mut cache, 50, 900), (100, 50));
        assert_eq!(ends(&mut cache, 0, 1000), (100, 100));
        assert_eq!(ends(&mut cache, 20, 30), (30, 0)); // all of it
        assert_eq!(ends(&mut cache, 140, 770), (10, 10));
        assert_eq!(ends(&mut cache, 300, 100), (0, 0));
        // Two extents covering the whole read between them.
        assert_eq!(ends(&mut cache, 120, 0), (0, 0));
        cache.insert(150, Bytes::copy_from_slice(&object[150..900]));
        assert_eq!(ends(&mut cache, 40, 860), (110, 750));
    }

    #[test]
    fn a_buffer_past_any_memory_is_an_error_not_an_abort() {
        let e = zeroed("s3://b/k", 1 << 62).unwrap_err();
        assert_eq!(e.kind, ErrorKind::Memory { bytes: 1 << 62 });
        assert!(e.to_string().contains("out of memory"), "{e}");
        assert_eq!(zeroed("s3://b/k", 3).unwrap(), vec![0u8; 3]);
    }
}
