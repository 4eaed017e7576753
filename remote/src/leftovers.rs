//! Objects a failed multi-object upload (a zrecord store's publish, a
//! sharded or directory checkpoint's) put and then could not delete (the
//! server gone for its deletes as for its upload): recorded in the upload
//! journal (`zt-uploads/` in the spool directory, beside the multipart
//! uploads [`crate::upload`] keeps) and deleted by the next write to the
//! same destination, so what is published there later does not find a
//! failed write's files among its own.
//!
//! A journal names its [`Destination`]: the prefix written under and the
//! object that makes a write there whole (its claim: a store's `meta.zr`,
//! a checkpoint's index), so two checkpoints sharing a prefix clear only
//! their own leftovers. Only what a journal recorded is ever deleted, and
//! only the version it recorded: an entry whose object now has another
//! ETag (someone wrote it since) is dropped without deleting. An entry
//! whose version is unknown (the upload that failed may or may not have
//! stored it) is deleted when present. The caller's `keep` rule spares
//! entries (they stay journaled): zrecord and `zt clean` keep everything
//! while the claim is present ([`unless_claimed`]); a checkpoint clears
//! after its own index landed and keeps only the names it just wrote.

use std::fs::File;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};

use crate::config::RemoteConfig;
use crate::error::{Error, ErrorKind, Result};
use crate::list::{list, list_tree, Listed};
use crate::upload::{delete_object, journal_dir};

const EXTENSION: &str = "leftover";

/// One object left behind: its URL and the ETag of the version put, if the
/// server's response said it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Leftover {
    /// The object's URL.
    pub url: String,
    /// The version this process put (`None`: unknown).
    pub etag: Option<String>,
}

/// Where a multi-object write publishes: every object it puts is under
/// `prefix` (a URL, no trailing `/`), and `claim` (a name relative to it)
/// is the object written last, whose presence makes the write whole.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Destination {
    /// The URL prefix, without a trailing `/`.
    pub prefix: String,
    /// The object written last (`meta.zr`, `model.safetensors.index.json`).
    pub claim: String,
}

impl Destination {
    /// The destination `claim` under `prefix` (a trailing `/` dropped).
    pub fn new(prefix: &str, claim: &str) -> Destination {
        Destination {
            prefix: prefix.trim_end_matches('/').to_string(),
            claim: claim.to_string(),
        }
    }

    /// `url`'s name relative to the prefix, if it is under it.
    fn name_of<'u>(&self, url: &'u str) -> Option<&'u str> {
        url.strip_prefix(&self.prefix)?
            .strip_prefix('/')
            .filter(|n| !n.is_empty())
    }
}

/// What became of one journaled object when its journal was cleared.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// Deleted: it held the version the journal recorded.
    Deleted,
    /// Absent already.
    Gone,
    /// Another version is there (written since): dropped, not deleted.
    Replaced,
    /// Spared by the caller's rule, or its delete failed: still journaled.
    Kept,
}

/// Record `left`, objects put for `dest`, in a journal of its own. The
/// file's lock is released when this returns: the entries are anyone's to
/// clear from then on.
pub fn record(config: &RemoteConfig, dest: &Destination, left: &[Leftover]) -> Result<()> {
    match encode(dest, left) {
        Some(text) => write_journal(config, &text),
        None => Ok(()),
    }
}

/// A journal's text: the destination on two `#` lines, then each entry's
/// URL and ETag on a line each. A URL or ETag holding a line break cannot
/// be journaled so (no store names one so); the rest still can. `None`
/// when no entry is left to record.
fn encode(dest: &Destination, left: &[Leftover]) -> Option<String> {
    let line = |s: &str| !s.contains('\n');
    let entries: String = left
        .iter()
        .filter(|l| line(&l.url) && line(l.etag.as_deref().unwrap_or("")))
        .map(|l| format!("{}\n{}\n", l.url, l.etag.as_deref().unwrap_or("")))
        .collect();
    if entries.is_empty() || !line(&dest.prefix) || !line(&dest.claim) {
        return None;
    }
    Some(format!("#{}\n#{}\n{entries}", dest.prefix, dest.claim))
}

fn write_journal(config: &RemoteConfig, text: &str) -> Result<()> {
    let (path, mut file) = crate::upload::create_journal(config, EXTENSION)?;
    file.write_all(text.as_bytes())
        .and_then(|()| file.sync_all())
        .map_err(|e| Error::io(path.display(), e))
}

/// A journal's destination and entries. A journal without the `#` lines
/// is one zrecord's publish wrote before checkpoints journaled too: its
/// destination is its first entry's directory, claimed by `meta.zr`.
fn parse(text: &str) -> Option<(Destination, Vec<Leftover>)> {
    let mut lines: Vec<&str> = text.lines().collect();
    let dest = match lines.as_slice() {
        [p, c, ..] if p.starts_with('#') && c.starts_with('#') => {
            let dest = Destination::new(&p[1..], &c[1..]);
            lines.drain(..2);
            dest
        }
        [first, ..] => Destination::new(first.rsplit_once('/')?.0, "meta.zr"),
        [] => return None,
    };
    let entries = lines
        .chunks_exact(2)
        .map(|pair| Leftover {
            url: pair[0].to_string(),
            etag: (!pair[1].is_empty()).then(|| pair[1].to_string()),
        })
        .collect();
    Some((dest, entries))
}

/// ETags as listings and PUT responses spell them differ in quoting (and
/// a weak marker): compare what is inside.
fn same_etag(a: &str, b: &str) -> bool {
    let bare = |s: &str| {
        s.trim()
            .trim_start_matches("W/")
            .trim_matches('"')
            .to_string()
    };
    bare(a) == bare(b)
}

/// True if `now` is the version `left` recorded (or may be: a journaled
/// version unknown).
fn recorded(left: &Leftover, now: &Listed) -> bool {
    match (&left.etag, &now.etag) {
        (Some(put), Some(there)) => same_etag(put, there),
        (Some(_), None) => false,
        (None, _) => true,
    }
}

/// The rule zrecord's publish and `zt clean` clear by: nothing while the
/// destination's claim is present (a whole store or checkpoint is there,
/// whose objects are read through it, whoever put them).
pub fn unless_claimed(dest: &Destination) -> impl Fn(&[Listed], &str) -> bool + '_ {
    move |now, _| now.iter().any(|l| l.name == dest.claim)
}

/// After a multi-object write for `dest` failed at the object `failed`
/// (its upload, or a delete it needed): delete the objects `sent` before
/// it, and `failed` itself when a version of it that was not there before
/// reached the server (a request can fail after the server stored its
/// object, its response lost), newest first, so the claim never outlives
/// an object it names. `before` is `failed`'s state before the write:
/// `None` absent, `Some(etag)` present (with that version, if known; a
/// present object of unknown version is never taken for one this write
/// put). Object storage has no multi-object atomicity, so this is the
/// write's discard. What cannot be deleted (the server gone: deleting
/// fails as the upload did) is journaled with the versions put, for the
/// next write to `dest` to delete; the returned text names it, for the
/// error's detail (`None`: nothing was left).
pub fn withdraw(
    config: &RemoteConfig,
    dest: &Destination,
    sent: &[Leftover],
    failed: &str,
    before: Option<Option<String>>,
) -> Option<String> {
    let mut doomed = sent.to_vec();
    let landed = match failed.rsplit_once('/') {
        Some((parent, name)) => match list(parent, config) {
            Ok(now) => now
                .into_iter()
                .find(|l| l.name == name)
                .filter(|l| match &before {
                    None => true,
                    Some(None) => false,
                    Some(Some(was)) => l.etag.as_deref().is_none_or(|e| !same_etag(e, was)),
                })
                .map(|l| l.etag),
            // Unlisted: delete it unless it was there before (its old
            // version is not this call's to remove); its version unknown.
            Err(_) => before.is_none().then_some(None),
        },
        None => None,
    };
    if let Some(etag) = landed {
        doomed.push(Leftover {
            url: failed.to_string(),
            etag,
        });
    }
    let left: Vec<Leftover> = doomed
        .into_iter()
        .rev()
        .filter(|left| delete_object(&left.url, config).is_err())
        .collect();
    if left.is_empty() {
        return None;
    }
    let journaled = match record(config, dest, &left) {
        Ok(()) => "journaled: the next publish to this prefix deletes them".to_string(),
        Err(e) => format!("journaling them failed too ({e})"),
    };
    let names: Vec<&str> = left.iter().map(|l| l.url.as_str()).collect();
    Some(format!(
        "; removing what the failed upload had put failed too, left: {} ({journaled})",
        names.join(", ")
    ))
}

/// Delete the recorded leftovers of `dest` (journals of any process,
/// locked while this one works on them). An entry `keep(listing, name)`
/// spares (`listing`: what the prefix holds now, names relative to it)
/// stays journaled, as does one whose delete fails. Returns each
/// journaled object's URL and what became of it.
pub fn clear(
    config: &RemoteConfig,
    dest: &Destination,
    keep: impl Fn(&[Listed], &str) -> bool,
) -> Result<Vec<(String, Outcome)>> {
    let mut out = Vec::new();
    for path in journals(config) {
        out.extend(clear_journal(
            config,
            &path,
            &|d| d == dest,
            &|_, now, name| keep(now, name),
        )?);
    }
    Ok(out)
}

/// Clear every journal in the spool directory (`zt clean`), each by
/// [`unless_claimed`] for its own destination. A destination that cannot
/// be listed (unreachable, no credentials) keeps its journal; the others
/// are still cleared.
pub fn clear_all(config: &RemoteConfig) -> Vec<(String, Outcome)> {
    journals(config)
        .iter()
        .filter_map(|path| {
            clear_journal(config, path, &|_| true, &|d, now, name| {
                unless_claimed(d)(now, name)
            })
            .ok()
        })
        .flatten()
        .collect()
}

/// The journal files in the spool directory.
fn journals(config: &RemoteConfig) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(journal_dir(config)) else {
        return Vec::new();
    };
    entries
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == EXTENSION))
        .collect()
}

/// Spares a journaled entry: given its destination, what the prefix holds
/// now and the entry's name.
type Keep<'a> = dyn Fn(&Destination, &[Listed], &str) -> bool + 'a;

/// Clear one journal whose destination is `wanted`: entries `keep` does not spare deleted (or dropped,
/// when gone or replaced), the rest written to a journal of their own, the
/// file removed.
fn clear_journal(
    config: &RemoteConfig,
    path: &Path,
    wanted: &dyn Fn(&Destination) -> bool,
    keep: &Keep<'_>,
) -> Result<Vec<(String, Outcome)>> {
    let mut out = Vec::new();
    let Ok(mut file) = File::open(path) else {
        return Ok(out);
    };
    // Another process clearing (or still writing) it: leave it.
    if !zt_fsutil::try_lock(&file, true).unwrap_or(false) {
        return Ok(out);
    }
    let mut text = String::new();
    if file.read_to_string(&mut text).is_err() {
        return Ok(out);
    }
    let Some((dest, entries)) = parse(&text) else {
        let _ = std::fs::remove_file(path);
        return Ok(out);
    };
    if !wanted(&dest) {
        return Ok(out);
    }
    // Nested names (a checkpoint directory's) need the whole tree listed;
    // a flat destination's directory is one delimited listing.
    let nested = entries
        .iter()
        .any(|l| dest.name_of(&l.url).is_some_and(|n| n.contains('/')));
    let listed = if nested {
        list_tree(&dest.prefix, config)?
    } else {
        list(&dest.prefix, config)?
    };
    let mut kept = Vec::new();
    for left in entries {
        let Some(name) = dest.name_of(&left.url) else {
            continue; // not under its own destination: never this journal's
        };
        // Gone or replaced since: never this journal's to delete, dropped
        // whatever the rule says; a version it recorded, unless spared.
        let outcome = match listed.iter().find(|l| l.name == name) {
            None => Outcome::Gone,
            Some(now) if !recorded(&left, now) => Outcome::Replaced,
            Some(_) if keep(&dest, &listed, name) => Outcome::Kept,
            Some(_) => match delete_object(&left.url, config) {
                Ok(()) => Outcome::Deleted,
                Err(e) if e.kind == ErrorKind::NotFound => Outcome::Gone,
                Err(_) => Outcome::Kept,
            },
        };
        if outcome == Outcome::Kept {
            kept.push(left.clone());
        }
        out.push((left.url, outcome));
    }
    if let Some(text) = encode(&dest, &kept) {
        write_journal(config, &text)?;
    }
    let _ = std::fs::remove_file(path);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn temp_config() -> (PathBuf, RemoteConfig) {
        let spool =
            std::env::temp_dir().join(format!("zt-leftovers-{:016x}", zt_fsutil::random_u64()));
        let config = RemoteConfig {
            spool_dir: Some(spool.clone()),
            ..RemoteConfig::default()
        };
        (spool, config)
    }

    #[test]
    fn entries_round_trip_and_etags_compare_unquoted() {
        let dest = Destination::new("s3://b/p/", "meta.zr");
        let left = [
            Leftover {
                url: "s3://b/p/data_1.zr".into(),
                etag: Some("\"abc\"".into()),
            },
            Leftover {
                url: "s3://b/p/sub/data_2.zr".into(),
                etag: None,
            },
        ];
        let text = encode(&dest, &left).unwrap();
        assert_eq!(parse(&text), Some((dest.clone(), left.to_vec())));
        assert_eq!(dest.name_of(&left[1].url), Some("sub/data_2.zr"));
        assert_eq!(dest.name_of("s3://b/pq/data_1.zr"), None);
        assert!(same_etag("\"abc\"", "abc"));
        assert!(same_etag("W/\"abc\"", "\"abc\""));
        assert!(!same_etag("\"abc\"", "\"abd\""));
    }

    #[test]
    fn a_journal_without_its_destination_is_a_zrecord_stores() {
        let (dest, left) = parse("s3://b/p/data_0.zr\n\"e\"\n").unwrap();
        assert_eq!(dest, Destination::new("s3://b/p", "meta.zr"));
        assert_eq!(left[0].etag.as_deref(), Some("\"e\""));
        assert_eq!(parse(""), None);
    }

    #[test]
    fn a_torn_or_foreign_journal_names_nothing_outside_its_destination() {
        // Cut off mid-entry, or holding only its destination: the whole
        // entries it has, nothing more, and no panic.
        let (dest, left) = parse("#s3://b/p\n#idx\ns3://b/p/a\n\"e\"\ns3://b/p/b\n").unwrap();
        assert_eq!(dest, Destination::new("s3://b/p", "idx"));
        assert_eq!(left.len(), 1);
        assert_eq!(parse("#s3://b/p\n#idx\n").unwrap().1, Vec::new());
        assert_eq!(parse("#only\n"), None);
        // An entry outside the destination's prefix is never one of its
        // names (clearing drops it unlisted and undeleted).
        for url in ["s3://b/q/a", "s3://b/pa", "s3://b/p", "s3://b/p/"] {
            assert_eq!(dest.name_of(url), None, "{url}");
        }
    }

    #[test]
    fn a_journal_of_another_destination_is_left_alone() {
        let (spool, config) = temp_config();
        let left = [Leftover {
            url: "s3://b/p/other-00001-of-00002.safetensors".into(),
            etag: None,
        }];
        record(
            &config,
            &Destination::new("s3://b/p", "other.safetensors.index.json"),
            &left,
        )
        .unwrap();
        // Another checkpoint under the same prefix: no listing, no delete,
        // the journal kept as it was.
        let mine = Destination::new("s3://b/p", "model.safetensors.index.json");
        assert_eq!(clear(&config, &mine, |_, _| false).unwrap(), Vec::new());
        assert_eq!(journals(&config).len(), 1);
        let _ = std::fs::remove_dir_all(&spool);
    }
}
