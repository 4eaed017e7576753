//! Stores in object storage (`s3://bucket/prefix.zr`): the same layout as
//! on disk, one object per file (`meta.zr`, `data_N.zr`, `dict.zr`).
//!
//! Opening reads `meta.zr`'s head (the 4096-byte page and the first
//! RecordLocs; a small `meta.zr` whole) in one GET and lists the prefix once:
//! the listing gives every shard's size and ETag, so shards cost no request
//! until a gather reads them, and every read is pinned to the version
//! listed. The RecordLoc table is fetched whole when it is small and paged
//! in on demand when it is large. A gather looks up every RecordLoc first,
//! sorts the records by (shard, offset), coalesces neighbours, sends the
//! requests of all shards concurrently on the remote crate's runtime (as
//! many in flight as its budget admits, however many CPUs there are:
//! `zt_remote::fetch`), and decodes into the caller's buffer on the CPU
//! pool.
//!
//! A caller that knows its next gathers (the DataLoader, its prefetch
//! window) starts them early with `Objects::fetch_ahead`: the records'
//! requests go out at once and the gather of exactly those indices later
//! takes their bytes instead of asking again.
//!
//! With `cache="dir"` a store no larger than `cache_bytes` is fetched whole
//! into the object cache at open and read locally (`crate::remote_cache`).
//!
//! Writing: a store is built locally in a spool and, on close, its shards
//! and dictionary are uploaded first and `meta.zr` last, so a reader that
//! finds `meta.zr` finds the complete store. Object storage has no
//! multi-object atomicity: replacing an existing store in place is refused,
//! and an upload that fails partway deletes the objects it had put, so a
//! failed store leaves no data shards under its prefix.

use std::path::Path;

/// The same URL, configuration and error mapping for the other sources
/// read from object storage (a Megatron `.bin`, `crate::binidx`).
#[cfg(feature = "remote")]
pub(crate) use enabled::{config, error};
#[cfg(feature = "remote")]
pub use enabled::{open, publish, read_small, write_small, Objects};

use crate::error::{Error, RemoteKind, Result};

/// True if `path` names an object-storage location rather than a directory.
pub fn is_url(path: &Path) -> bool {
    path.to_str()
        .is_some_and(|s| zt_remote::URL_SCHEMES.iter().any(|p| s.starts_with(p)))
}

/// Without the `remote` feature a URL cannot be opened.
#[cfg(not(feature = "remote"))]
pub fn open(
    path: &Path,
    _dense: Option<bool>,
    _storage_options: &[(String, String)],
) -> Result<crate::Reader> {
    Err(unsupported(path))
}

/// Without the `remote` feature a URL cannot be read.
#[cfg(not(feature = "remote"))]
pub fn read_small(
    path: &Path,
    _max: u64,
    _storage_options: &[(String, String)],
) -> Result<Vec<u8>> {
    Err(unsupported(path))
}

/// Without the `remote` feature a URL cannot be written.
#[cfg(not(feature = "remote"))]
pub fn write_small(
    path: &Path,
    _bytes: &[u8],
    _storage_options: &[(String, String)],
) -> Result<()> {
    Err(unsupported(path))
}

#[cfg(not(feature = "remote"))]
pub(crate) fn unsupported(path: &Path) -> Error {
    Error::Remote {
        path: path.into(),
        kind: RemoteKind::Unsupported,
        detail: "this build of zrecord has no object-storage support (the `remote` feature)".into(),
    }
}

#[cfg(feature = "remote")]
mod enabled {
    use std::collections::{HashMap, VecDeque};
    use std::path::{Path, PathBuf};
    use std::sync::{Arc, Mutex};

    use rayon::prelude::*;
    use zt_remote::fetch::{ranges_of, Pending};
    use zt_remote::{ErrorKind, RemoteConfig, RemoteObject};

    use super::*;
    use crate::layout::{Header, RecordLoc, LOC, PAGE};
    use crate::Reader;

    /// RecordLoc tables up to this size are fetched whole at open.
    const LOADED_LOCS: u64 = 64 << 20;

    /// Gathers fetched ahead and kept for their gather: more than a
    /// DataLoader's prefetch window usually asks for at once; the oldest is
    /// cancelled past it (a gather that never came, after a seek).
    const AHEAD_SLOTS: usize = 64;
    /// The most stored bytes the gathers fetched ahead may hold together
    /// (the DataLoader's default `prefetch_bytes`); the oldest are
    /// cancelled past it.
    const AHEAD_BYTES: u64 = 1 << 30;

    pub(crate) fn error(path: &Path, e: zt_remote::Error) -> Error {
        let kind = match e.kind {
            ErrorKind::NotFound => return Error::NotFound { path: path.into() },
            ErrorKind::Memory { bytes } => {
                return Error::Memory {
                    path: path.into(),
                    what: "a read from object storage",
                    bytes,
                }
            }
            kind => kind,
        };
        Error::Remote {
            path: PathBuf::from(e.url),
            kind,
            detail: e.detail,
        }
    }

    fn text(path: &Path) -> Result<&str> {
        path.to_str().ok_or_else(|| Error::Remote {
            path: path.into(),
            kind: RemoteKind::Config,
            detail: "the URL is not UTF-8".into(),
        })
    }

    pub(crate) fn config(
        path: &Path,
        storage_options: &[(String, String)],
    ) -> Result<Arc<RemoteConfig>> {
        RemoteConfig::from_options(storage_options)
            .map(Arc::new)
            .map_err(|e| error(path, e))
    }

    /// Where a remote store's RecordLocs come from.
    enum LocTable {
        /// The whole table, fetched at open.
        Loaded(Vec<u8>),
        /// `meta.zr` itself, read (through its cache) as gathers need it.
        Paged(Arc<RemoteObject>),
    }

    /// The objects of a store in object storage.
    pub struct Objects {
        locs: LocTable,
        /// Each data shard (`None` when empty).
        shards: Vec<Option<Arc<RemoteObject>>>,
        /// Gathers started by [`Objects::fetch_ahead`], oldest first.
        ahead: Mutex<VecDeque<Ahead>>,
    }

    /// One gather's frames requested early.
    struct Ahead {
        idxs: Vec<u64>,
        /// The stored bytes it fetches.
        bytes: u64,
        /// The requests' positions in `idxs`, per shard fetched.
        members: Vec<Vec<usize>>,
        frames: Pending<zt_remote::Result<Vec<Vec<Vec<u8>>>>>,
    }

    /// One gather's requests: per shard fetched, the positions in `idxs`
    /// of its records and the shard's ranges.
    type Requests = (Vec<Vec<usize>>, Vec<zt_remote::fetch::ObjectRanges>);

    /// Open the store at the URL `path`.
    pub fn open(
        path: &Path,
        dense: Option<bool>,
        storage_options: &[(String, String)],
    ) -> Result<Reader> {
        let url = text(path)?.trim_end_matches('/').to_string();
        let config = config(path, storage_options)?;
        let meta_url = format!("{url}/meta.zr");
        let meta_path = PathBuf::from(&meta_url);
        let meta =
            RemoteObject::open(&meta_url, Arc::clone(&config)).map_err(|e| error(path, e))?;
        let page = meta
            .read(0, (PAGE as u64).min(meta.len()))
            .map_err(|e| error(path, e))?;
        let header = Header::decode(&page, meta.len(), &meta_path)?;
        let listing = zt_remote::list::list(&url, &config).map_err(|e| error(path, e))?;
        let (shards, dict_entry) = check_objects(path, &url, &header, listing, &config)?;
        if let Some(dir) = &config.cache_dir {
            let mut objects = vec![("meta.zr".to_string(), &meta)];
            let mut empty = Vec::new();
            for (s, shard) in shards.iter().enumerate() {
                match shard {
                    Some(o) => objects.push((format!("data_{s}.zr"), o.as_ref())),
                    None => empty.push(format!("data_{s}.zr")),
                }
            }
            objects.extend(dict_entry.as_ref().map(|d| ("dict.zr".to_string(), d)));
            let view = crate::remote_cache::view(&url, &objects, &empty, dir, config.cache_bytes)
                .map_err(|e| error(path, e))?;
            // A view whose entries another process evicted since fails to
            // open: the store is read by ranges instead. Errors name the
            // store's URL, which the user gave, not the cache's directory.
            if let Some(Ok(reader)) = view.map(|v| Reader::open_at(v, dense, &[])) {
                return Ok(reader.relabeled(path));
            }
        }
        let dict = match dict_entry {
            Some(dict) => Some(dict.read(0, dict.len()).map_err(|e| error(path, e))?),
            None => None,
        };
        crate::reader::check_dict(path, header.codec, dict.as_deref())?;
        let schema = Reader::decode_schema(&header, dense, &meta_path)?;
        let table = header.length * LOC as u64;
        let meta = Arc::new(meta);
        let locs = if table <= LOADED_LOCS {
            LocTable::Loaded(meta.read(PAGE as u64, table).map_err(|e| error(path, e))?)
        } else {
            LocTable::Paged(meta)
        };
        let objects = Objects {
            locs,
            shards,
            ahead: Mutex::new(VecDeque::new()),
        };
        Reader::remote(
            path.to_path_buf(),
            header,
            schema,
            objects,
            dict.as_deref(),
            &page,
        )
    }

    /// The listing must hold exactly the shards the header names (each at
    /// least as long as its tail), as a local open checks the directory.
    #[allow(clippy::type_complexity)]
    fn check_objects(
        path: &Path,
        url: &str,
        header: &Header,
        listing: Vec<zt_remote::list::Listed>,
        config: &Arc<RemoteConfig>,
    ) -> Result<(Vec<Option<Arc<RemoteObject>>>, Option<RemoteObject>)> {
        let count = header.data_shards as usize;
        let mut found: HashMap<usize, zt_remote::list::Listed> = HashMap::new();
        let mut dict = None;
        let object = |l: &zt_remote::list::Listed| {
            let object_url = format!("{url}/{}", l.name);
            match &l.etag {
                Some(tag) => {
                    RemoteObject::listed(&object_url, Arc::clone(config), l.size, tag.clone())
                }
                // No ETag to pin to: the listed size still plans the open.
                None => RemoteObject::open_sized(&object_url, Arc::clone(config), l.size),
            }
            .map_err(|e| error(path, e))
        };
        for l in listing {
            if l.name == "dict.zr" {
                dict = Some(object(&l)?);
            } else if let Some(rest) = l.name.strip_prefix("data_") {
                let n = rest
                    .strip_suffix(".zr")
                    .and_then(|n| n.parse::<usize>().ok())
                    .filter(|&n| n < count && format!("data_{n}.zr") == l.name);
                match n {
                    Some(n) => {
                        found.insert(n, l);
                    }
                    None => {
                        return Err(Error::UnexpectedShard {
                            path: path.into(),
                            name: l.name,
                        })
                    }
                }
            }
        }
        let mut shards = Vec::with_capacity(count);
        for (s, &tail) in header.tails.iter().enumerate() {
            let l = found.remove(&s).ok_or_else(|| Error::MissingShard {
                path: path.into(),
                shard: s,
            })?;
            if l.size < tail {
                return Err(Error::ShortShard {
                    path: PathBuf::from(format!("{url}/{}", l.name)),
                    len: l.size,
                    tail,
                });
            }
            shards.push(if tail == 0 {
                None
            } else {
                Some(Arc::new(object(&l)?))
            });
        }
        Ok((shards, dict))
    }

    impl Objects {
        /// The validated RecordLocs of `idxs` (in order).
        pub(crate) fn locs(&self, reader: &Reader, idxs: &[u64]) -> Result<Vec<RecordLoc>> {
            let decode = |bytes: &[u8]| RecordLoc::decode(bytes);
            let locs: Vec<RecordLoc> = match &self.locs {
                LocTable::Loaded(table) => idxs
                    .iter()
                    .map(|&i| decode(&table[i as usize * LOC..(i as usize + 1) * LOC]))
                    .collect(),
                LocTable::Paged(meta) => {
                    let ranges: Vec<(u64, u64)> = idxs
                        .iter()
                        .map(|&i| (PAGE as u64 + i * LOC as u64, LOC as u64))
                        .collect();
                    meta.prefetch(&ranges)
                        .map_err(|e| error(reader.path(), e))?;
                    ranges
                        .iter()
                        .map(|&(at, len)| meta.read(at, len).map(|b| decode(&b)))
                        .collect::<zt_remote::Result<_>>()
                        .map_err(|e| error(reader.path(), e))?
                }
            };
            for (&i, &loc) in idxs.iter().zip(&locs) {
                reader.check_loc(i, loc)?;
            }
            Ok(locs)
        }

        /// The requests of a gather of `idxs` (whose `locs` were looked
        /// up): each shard's records and their ranges.
        fn requests(&self, reader: &Reader, idxs: &[u64], locs: &[RecordLoc]) -> Result<Requests> {
            let shards = reader.header.data_shards as u64;
            let mut by_shard: Vec<Vec<usize>> = vec![Vec::new(); self.shards.len()];
            for (j, &i) in idxs.iter().enumerate() {
                by_shard[(i % shards) as usize].push(j);
            }
            let mut members = Vec::new();
            let mut jobs = Vec::new();
            for (s, these) in by_shard.into_iter().enumerate() {
                if these.is_empty() {
                    continue;
                }
                let object = self.shards[s].as_ref().ok_or_else(|| Error::BadLoc {
                    path: reader.path().into(),
                    index: idxs[these[0]],
                    reason: "record in an empty shard",
                })?;
                let ranges = these
                    .iter()
                    .map(|&j| (locs[j].offset, u64::from(locs[j].phys)))
                    .collect();
                jobs.push((Arc::clone(object), ranges));
                members.push(these);
            }
            Ok((members, jobs))
        }

        /// Start fetching the frames of a gather of `idxs` now, for the
        /// gather of exactly these indices to take later (the oldest
        /// started gathers are cancelled past [`AHEAD_SLOTS`] or
        /// [`AHEAD_BYTES`]).
        pub(crate) fn fetch_ahead(&self, reader: &Reader, idxs: &[u64]) -> Result<()> {
            let locs = self.locs(reader, idxs)?;
            let (members, jobs) = self.requests(reader, idxs, &locs)?;
            let bytes = locs.iter().map(|l| u64::from(l.phys)).sum();
            let frames =
                zt_remote::fetch::spawn(ranges_of(jobs)).map_err(|e| error(reader.path(), e))?;
            let mut ahead = self.ahead.lock().unwrap_or_else(|p| p.into_inner());
            let held = |a: &VecDeque<Ahead>| a.iter().map(|a| a.bytes).sum::<u64>();
            while !ahead.is_empty()
                && (ahead.len() >= AHEAD_SLOTS || held(&ahead) + bytes > AHEAD_BYTES)
            {
                ahead.pop_front();
            }
            ahead.push_back(Ahead {
                idxs: idxs.to_vec(),
                bytes,
                members,
                frames,
            });
            Ok(())
        }

        /// The stored frames of `idxs` (whose `locs` were looked up): those
        /// fetched ahead for exactly these indices, else the records of
        /// every shard planned together (sorted, neighbours coalesced) and
        /// all shards' requests sent at once, the budget bounding them.
        fn frames(
            &self,
            reader: &Reader,
            idxs: &[u64],
            locs: &[RecordLoc],
        ) -> Result<Vec<Vec<u8>>> {
            let started = {
                let mut ahead = self.ahead.lock().unwrap_or_else(|p| p.into_inner());
                let at = ahead.iter().position(|a| a.idxs == idxs);
                at.and_then(|at| ahead.remove(at))
            };
            let (members, fetched) = match started {
                Some(a) => (a.members, a.frames.wait()),
                None => {
                    let (members, jobs) = self.requests(reader, idxs, locs)?;
                    (members, zt_remote::runtime::block_on(ranges_of(jobs)))
                }
            };
            let fetched = fetched
                .and_then(|r| r)
                .map_err(|e| error(reader.path(), e))?;
            let mut out: Vec<Vec<u8>> = vec![Vec::new(); idxs.len()];
            for (these, bytes) in members.into_iter().zip(fetched) {
                for (j, bytes) in these.into_iter().zip(bytes) {
                    out[j] = bytes;
                }
            }
            Ok(out)
        }

        /// A Dense gather of fixed-width rows into `dst`.
        pub(crate) fn gather_dense(
            &self,
            reader: &Reader,
            idxs: &[u64],
            dst: &mut [u8],
            row: usize,
        ) -> Result<()> {
            let locs = self.locs(reader, idxs)?;
            let frames = self.frames(reader, idxs, &locs)?;
            dst.par_chunks_mut(row.max(1))
                .zip(idxs.par_iter().zip(locs.par_iter().zip(frames.par_iter())))
                .try_for_each(|(out, (&i, (&loc, frame)))| reader.decode_row(i, loc, frame, out))
        }

        /// Fill a Ragged gather's payloads and shapes (offsets computed from
        /// `locs` by the caller).
        #[allow(clippy::too_many_arguments)]
        pub(crate) fn fill_ragged(
            &self,
            reader: &Reader,
            idxs: &[u64],
            locs: &[RecordLoc],
            offsets: &[u64],
            values: &mut [u8],
            shapes: &mut [u64],
            ndim: usize,
        ) -> Result<()> {
            let frames = self.frames(reader, idxs, locs)?;
            let mut scratch = Vec::new();
            for (j, &i) in idxs.iter().enumerate() {
                let (at, end) = (offsets[j] as usize, offsets[j + 1] as usize);
                let shape = &mut shapes[j * ndim..(j + 1) * ndim];
                reader.place_ragged(
                    i,
                    locs[j],
                    &frames[j],
                    &mut scratch,
                    shape,
                    &mut values[at..end],
                )?;
            }
            Ok(())
        }
    }

    /// A small object's bytes (a dataset manifest), refused past `max`.
    pub fn read_small(
        path: &Path,
        max: u64,
        storage_options: &[(String, String)],
    ) -> Result<Vec<u8>> {
        let url = text(path)?.to_string();
        let config = config(path, storage_options)?;
        let object = RemoteObject::open(&url, config).map_err(|e| error(path, e))?;
        if object.len() > max {
            return Err(Error::Invalid {
                reason: format!("{url}: {} bytes, past the {max}-byte limit", object.len()),
            });
        }
        object.read(0, object.len()).map_err(|e| error(path, e))
    }

    /// Put `bytes` at the URL `path` (one object, replaced whole).
    pub fn write_small(
        path: &Path,
        bytes: &[u8],
        storage_options: &[(String, String)],
    ) -> Result<()> {
        let url = text(path)?.to_string();
        let config = config(path, storage_options)?;
        let local =
            std::env::temp_dir().join(format!("zt-manifest-{:016x}", zt_fsutil::random_u64()));
        let uploaded = std::fs::write(&local, bytes)
            .map_err(|e| Error::io(&local, e))
            .and_then(|()| {
                zt_remote::upload_file(&local, &url, &config).map_err(|e| error(path, e))
            });
        let _ = std::fs::remove_file(&local);
        uploaded.map(|_| ())
    }

    /// Upload the store built at `local` (a published local store) to the
    /// URL `dest`: shards and dictionary first, `meta.zr` last. A store
    /// already at `dest` is refused ([`Error::AlreadyExists`]). An upload
    /// that fails withdraws what this call put under the prefix (see
    /// `withdraw`), so a failed store leaves no data shards behind.
    pub fn publish(local: &Path, dest: &Path, storage_options: &[(String, String)]) -> Result<()> {
        let url = text(dest)?.trim_end_matches('/').to_string();
        let config = config(dest, storage_options)?;
        // Refused before any object goes up, not at the first large shard.
        zt_remote::ObjectUrl::parse(&url)
            .and_then(|target| zt_remote::upload::check_part_size(&target, 0, &config))
            .map_err(|e| error(dest, e))?;
        // What an earlier failed publish to this prefix put and could not
        // delete (journaled by `withdraw`) goes first, unless a store was
        // published there since: a store with fewer shards would otherwise
        // find the failed one's among its own.
        let journaled = zt_remote::leftovers::Destination::new(&url, "meta.zr");
        zt_remote::leftovers::clear(
            &config,
            &journaled,
            zt_remote::leftovers::unless_claimed(&journaled),
        )
        .map_err(|e| error(dest, e))?;
        let existing = zt_remote::list::list(&url, &config).map_err(|e| error(dest, e))?;
        if existing.iter().any(|l| l.name == "meta.zr") {
            return Err(Error::AlreadyExists { path: dest.into() });
        }
        let mut names: Vec<String> = std::fs::read_dir(local)
            .map_err(|e| Error::io(local, e))?
            .map(|e| e.map(|e| e.file_name().to_string_lossy().into_owned()))
            .collect::<std::io::Result<_>>()
            .map_err(|e| Error::io(local, e))?;
        // meta.zr names the store's shape: it goes last.
        names.sort_by_key(|n| (n == "meta.zr", n.clone()));
        let before: HashMap<String, Option<String>> =
            existing.into_iter().map(|l| (l.name, l.etag)).collect();
        let mut sent: Vec<(&str, Option<String>)> = Vec::with_capacity(names.len());
        for name in &names {
            let file = local.join(name);
            match zt_remote::upload_file_versioned(&file, &format!("{url}/{name}"), &config) {
                Ok((_, etag)) => sent.push((name, etag)),
                Err(e) => {
                    return Err(withdraw(
                        &url,
                        &config,
                        &sent,
                        name,
                        &before,
                        error(dest, e),
                    ))
                }
            }
        }
        Ok(())
    }

    /// After the upload of `failed` failed: withdraw what this publish put
    /// (`zt_remote::leftovers::withdraw`: `sent` and `failed` itself if a
    /// new version of it landed, newest first, so `meta.zr` never outlives
    /// a shard it names; what cannot be deleted journaled for the next
    /// publish to this prefix). Returns `err`, its detail extended with
    /// the objects left behind.
    fn withdraw(
        url: &str,
        config: &RemoteConfig,
        sent: &[(&str, Option<String>)],
        failed: &str,
        before: &HashMap<String, Option<String>>,
        mut err: Error,
    ) -> Error {
        let sent: Vec<zt_remote::leftovers::Leftover> = sent
            .iter()
            .map(|(name, etag)| zt_remote::leftovers::Leftover {
                url: format!("{url}/{name}"),
                etag: etag.clone(),
            })
            .collect();
        let left = zt_remote::leftovers::withdraw(
            config,
            &zt_remote::leftovers::Destination::new(url, "meta.zr"),
            &sent,
            &format!("{url}/{failed}"),
            before.get(failed).cloned(),
        );
        if let (Some(left), Error::Remote { detail, .. }) = (left, &mut err) {
            detail.push_str(&left);
        }
        err
    }
}
