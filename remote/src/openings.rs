//! Openings shared by a group of processes: what opening objects fetched
//! (each object's size, its version, and the bytes its open and structure
//! walk brought into its extent cache), recorded in the process that opened
//! them and replayed in the others, so a group of ranks opening one
//! checkpoint asks storage for its headers once instead of once per rank.
//!
//! A [`Recording`] notes every [`RemoteObject::open`] of this process while
//! it lives (and every object found missing, so a probe for a checkpoint
//! name is not sent again); [`Recording::finish`] encodes them. A [`Replay`]
//! of those bytes, while it lives, makes [`RemoteObject::open`] of a
//! recorded URL send no request: the object gets the recorded size and
//! version and the recorded bytes in its cache. Every later read is pinned
//! to the recorded version (`If-Match` and the response check of
//! `object.rs`), so all processes read one version, and an object replaced
//! since the recording fails every process's read with
//! [`ErrorKind::Changed`].
//!
//! The encoding is zt's own (nothing else reads it) and checked on decode:
//! bytes that are not a recording are an error, never a panic.
//!
//! [`RemoteObject::open`]: crate::RemoteObject::open

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use bytes::Bytes;
use chrono::DateTime;

use crate::error::{Error, ErrorKind, Result};
use crate::object::{ExtentCache, Version};

/// The first bytes of an encoded recording.
const MAGIC: &[u8] = b"zt.openings.1\n";

/// What opening one object found, as replayed.
#[derive(Debug)]
pub(crate) enum Recorded {
    /// The object: its size, version and the extents its cache held.
    Found {
        size: u64,
        version: Version,
        extents: Vec<(u64, Bytes)>,
    },
    /// No object at the URL.
    Missing,
}

/// One opening a recording noted; a found object's cache is read when the
/// recording finishes, so the blocks its structure walk fetched after the
/// open are included.
enum Noted {
    Found {
        size: u64,
        version: Version,
        cache: Arc<Mutex<ExtentCache>>,
    },
    Missing,
}

#[derive(Default)]
struct State {
    next_id: u64,
    recordings: Vec<(u64, Vec<(String, Noted)>)>,
    replays: Vec<(u64, HashMap<String, Arc<Recorded>>)>,
}

static STATE: Mutex<State> = Mutex::new(State {
    next_id: 0,
    recordings: Vec::new(),
    replays: Vec::new(),
});
/// Live recordings and replays: opening checks these before taking the lock.
static RECORDINGS: AtomicUsize = AtomicUsize::new(0);
static REPLAYS: AtomicUsize = AtomicUsize::new(0);

fn state() -> MutexGuard<'static, State> {
    STATE.lock().unwrap_or_else(|p| p.into_inner())
}

/// Notes the openings of this process while it lives (see the module).
#[derive(Debug)]
pub struct Recording {
    id: u64,
}

impl Recording {
    /// Start noting every object this process opens.
    pub fn start() -> Recording {
        let mut state = state();
        state.next_id += 1;
        let id = state.next_id;
        state.recordings.push((id, Vec::new()));
        RECORDINGS.fetch_add(1, Ordering::SeqCst);
        Recording { id }
    }

    /// Stop, and encode what was noted (the latest opening of each URL).
    pub fn finish(self) -> Vec<u8> {
        let noted = {
            let mut state = state();
            let at = state.recordings.iter().position(|(id, _)| *id == self.id);
            at.map(|i| state.recordings.remove(i).1).unwrap_or_default()
        };
        RECORDINGS.fetch_sub(1, Ordering::SeqCst);
        std::mem::forget(self); // unregistered above
        let mut latest: Vec<(String, Noted)> = Vec::with_capacity(noted.len());
        for (url, opening) in noted {
            latest.retain(|(seen, _)| *seen != url);
            latest.push((url, opening));
        }
        encode(&latest)
    }
}

impl Drop for Recording {
    fn drop(&mut self) {
        let mut state = state();
        state.recordings.retain(|(id, _)| *id != self.id);
        RECORDINGS.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Serves [`RemoteObject::open`](crate::RemoteObject::open) of the URLs of
/// a recording from it while it lives (see the module).
#[derive(Debug)]
pub struct Replay {
    id: u64,
}

impl Replay {
    /// Decode `encoded` (what [`Recording::finish`] returned, in any
    /// process) and serve its openings until dropped.
    pub fn start(encoded: &[u8]) -> Result<Replay> {
        let openings = decode(encoded)?;
        let mut state = state();
        state.next_id += 1;
        let id = state.next_id;
        state.replays.push((id, openings));
        REPLAYS.fetch_add(1, Ordering::SeqCst);
        Ok(Replay { id })
    }
}

impl Drop for Replay {
    fn drop(&mut self) {
        let mut state = state();
        state.replays.retain(|(id, _)| *id != self.id);
        REPLAYS.fetch_sub(1, Ordering::SeqCst);
    }
}

/// The recorded opening of `url`, from the latest live replay holding it.
pub(crate) fn replayed(url: &str) -> Option<Arc<Recorded>> {
    if REPLAYS.load(Ordering::SeqCst) == 0 {
        return None;
    }
    let state = state();
    state
        .replays
        .iter()
        .rev()
        .find_map(|(_, openings)| openings.get(url).cloned())
}

fn note(url: &str, opening: impl Fn() -> Noted) {
    if RECORDINGS.load(Ordering::SeqCst) == 0 {
        return;
    }
    let mut state = state();
    for (_, noted) in state.recordings.iter_mut() {
        noted.push((url.to_string(), opening()));
    }
}

/// Note an object opened (live recordings only).
pub(crate) fn note_found(url: &str, size: u64, version: &Version, cache: &Arc<Mutex<ExtentCache>>) {
    note(url, || Noted::Found {
        size,
        version: version.clone(),
        cache: Arc::clone(cache),
    });
}

/// Note an object found missing (live recordings only).
pub(crate) fn note_missing(url: &str) {
    note(url, || Noted::Missing);
}

// Tags of an encoded opening.
const MISSING: u8 = 0;
const ETAG: u8 = 1;
const MODIFIED: u8 = 2;

fn put_bytes(out: &mut Vec<u8>, bytes: &[u8]) {
    out.extend_from_slice(&(bytes.len() as u64).to_le_bytes());
    out.extend_from_slice(bytes);
}

fn encode(openings: &[(String, Noted)]) -> Vec<u8> {
    let mut out = MAGIC.to_vec();
    out.extend_from_slice(&(openings.len() as u64).to_le_bytes());
    for (url, opening) in openings {
        put_bytes(&mut out, url.as_bytes());
        let (size, version, cache) = match opening {
            Noted::Missing => {
                out.push(MISSING);
                continue;
            }
            Noted::Found {
                size,
                version,
                cache,
            } => (size, version, cache),
        };
        match version {
            Version::ETag(tag) => {
                out.push(ETAG);
                put_bytes(&mut out, tag.as_bytes());
            }
            Version::Modified(stamp) => {
                out.push(MODIFIED);
                out.extend_from_slice(&stamp.timestamp().to_le_bytes());
                out.extend_from_slice(&stamp.timestamp_subsec_nanos().to_le_bytes());
            }
        }
        out.extend_from_slice(&size.to_le_bytes());
        let extents = cache.lock().unwrap_or_else(|p| p.into_inner()).extents();
        out.extend_from_slice(&(extents.len() as u64).to_le_bytes());
        for (start, data) in extents {
            out.extend_from_slice(&start.to_le_bytes());
            put_bytes(&mut out, &data);
        }
    }
    out
}

/// A checking reader over encoded bytes.
struct Reader<'a> {
    rest: &'a [u8],
}

fn bad(why: impl Into<String>) -> Error {
    Error::new(
        ErrorKind::BadResponse,
        "",
        format!(
            "the openings another process shared are not a recording: {}",
            why.into()
        ),
    )
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: u64, what: &str) -> Result<&'a [u8]> {
        let n = usize::try_from(n)
            .ok()
            .filter(|&n| n <= self.rest.len())
            .ok_or_else(|| bad(format!("{what} runs past the end")))?;
        let (head, rest) = self.rest.split_at(n);
        self.rest = rest;
        Ok(head)
    }

    fn u64(&mut self, what: &str) -> Result<u64> {
        let bytes = self.take(8, what)?;
        Ok(u64::from_le_bytes(bytes.try_into().expect("8 bytes")))
    }

    fn u8(&mut self, what: &str) -> Result<u8> {
        Ok(self.take(1, what)?[0])
    }

    fn bytes(&mut self, what: &str) -> Result<&'a [u8]> {
        let n = self.u64(what)?;
        self.take(n, what)
    }

    fn text(&mut self, what: &str) -> Result<String> {
        let bytes = self.bytes(what)?;
        String::from_utf8(bytes.to_vec()).map_err(|_| bad(format!("{what} is not UTF-8")))
    }
}

fn decode(encoded: &[u8]) -> Result<HashMap<String, Arc<Recorded>>> {
    let mut r = Reader { rest: encoded };
    if r.take(MAGIC.len() as u64, "the header")? != MAGIC {
        return Err(bad("wrong header"));
    }
    let count = r.u64("the count")?;
    let mut openings = HashMap::new();
    for _ in 0..count {
        let url = r.text("a URL")?;
        let version = match r.u8("a tag")? {
            MISSING => {
                openings.insert(url, Arc::new(Recorded::Missing));
                continue;
            }
            ETAG => Version::ETag(r.text("an ETag")?),
            MODIFIED => {
                let secs = i64::from_le_bytes(r.take(8, "a stamp")?.try_into().expect("8 bytes"));
                let nanos = u32::from_le_bytes(r.take(4, "a stamp")?.try_into().expect("4 bytes"));
                Version::Modified(
                    DateTime::from_timestamp(secs, nanos)
                        .ok_or_else(|| bad(format!("{url}: stamp {secs}.{nanos} out of range")))?,
                )
            }
            tag => return Err(bad(format!("{url}: unknown tag {tag}"))),
        };
        let size = r.u64("a size")?;
        let n = r.u64("an extent count")?;
        let mut extents = Vec::new();
        for _ in 0..n {
            let start = r.u64("an extent")?;
            let data = r.bytes("an extent")?;
            if start
                .checked_add(data.len() as u64)
                .is_none_or(|end| end > size)
            {
                return Err(bad(format!(
                    "{url}: bytes {start}+{} past the object's {size}",
                    data.len()
                )));
            }
            extents.push((start, Bytes::copy_from_slice(data)));
        }
        let recorded = Recorded::Found {
            size,
            version,
            extents,
        };
        openings.insert(url, Arc::new(recorded));
    }
    if !r.rest.is_empty() {
        return Err(bad(format!(
            "{} bytes after the last opening",
            r.rest.len()
        )));
    }
    Ok(openings)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cache_of(extents: &[(u64, &[u8])]) -> Arc<Mutex<ExtentCache>> {
        let mut cache = ExtentCache::default();
        for &(start, data) in extents {
            cache.insert(start, Bytes::copy_from_slice(data));
        }
        Arc::new(Mutex::new(cache))
    }

    fn noted() -> Vec<(String, Noted)> {
        let stamp = DateTime::from_timestamp(1_700_000_000, 123).expect("a valid stamp");
        vec![
            (
                "s3://b/a.safetensors".into(),
                Noted::Found {
                    size: 100,
                    version: Version::ETag("\"e1\"".into()),
                    cache: cache_of(&[(0, b"head"), (90, b"tail------")]),
                },
            ),
            ("s3://b/model.safetensors".into(), Noted::Missing),
            (
                "https://h/x.bin".into(),
                Noted::Found {
                    size: 0,
                    version: Version::Modified(stamp),
                    cache: cache_of(&[]),
                },
            ),
        ]
    }

    #[test]
    fn what_is_encoded_decodes_as_it_was() {
        let decoded = decode(&encode(&noted())).expect("decodes");
        assert_eq!(decoded.len(), 3);
        match decoded["s3://b/a.safetensors"].as_ref() {
            Recorded::Found {
                size,
                version: Version::ETag(tag),
                extents,
            } => {
                assert_eq!((*size, tag.as_str()), (100, "\"e1\""));
                let got: Vec<(u64, &[u8])> = extents.iter().map(|(s, d)| (*s, &d[..])).collect();
                assert_eq!(got, [(0, &b"head"[..]), (90, &b"tail------"[..])]);
            }
            other => panic!("{other:?}"),
        }
        assert!(matches!(
            decoded["s3://b/model.safetensors"].as_ref(),
            Recorded::Missing
        ));
        match decoded["https://h/x.bin"].as_ref() {
            Recorded::Found {
                size: 0,
                version: Version::Modified(stamp),
                extents,
            } => {
                assert_eq!(
                    (stamp.timestamp(), stamp.timestamp_subsec_nanos()),
                    (1_700_000_000, 123)
                );
                assert!(extents.is_empty());
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn bytes_that_are_not_a_recording_are_refused() {
        let good = encode(&noted());
        // Every truncation, and trailing bytes, are errors, never panics.
        for n in 0..good.len() {
            let e = decode(&good[..n]).expect_err("truncated");
            assert_eq!(e.kind, ErrorKind::BadResponse);
        }
        let mut longer = good.clone();
        longer.push(0);
        assert!(decode(&longer)
            .unwrap_err()
            .to_string()
            .contains("after the last"));
        let mut tag = good.clone();
        tag[MAGIC.len()] ^= 1; // the count
        assert!(decode(&tag).is_err());
        // An extent past the object's size.
        let past = encode(&[(
            "s3://b/k".into(),
            Noted::Found {
                size: 3,
                version: Version::ETag("e".into()),
                cache: cache_of(&[(2, b"xy")]),
            },
        )]);
        assert!(decode(&past)
            .unwrap_err()
            .to_string()
            .contains("past the object"));
        // A length field claiming more than any memory.
        let mut huge = MAGIC.to_vec();
        huge.extend_from_slice(&1u64.to_le_bytes());
        huge.extend_from_slice(&u64::MAX.to_le_bytes());
        assert!(decode(&huge)
            .unwrap_err()
            .to_string()
            .contains("past the end"));
    }

    #[test]
    fn a_recording_notes_only_while_it_lives_and_a_replay_serves_only_while_it_lives() {
        let url = "s3://openings-test/only-here.bin";
        note_missing(url); // no recording yet: not noted
        let recording = Recording::start();
        note_missing(url);
        let encoded = recording.finish();
        note_missing(url); // finished: not noted
        let decoded = decode(&encoded).expect("decodes");
        assert_eq!(decoded.len(), 1);
        assert!(replayed(url).is_none());
        let replay = Replay::start(&encoded).expect("replays");
        assert!(matches!(replayed(url).as_deref(), Some(Recorded::Missing)));
        drop(replay);
        assert!(replayed(url).is_none());
    }
}
