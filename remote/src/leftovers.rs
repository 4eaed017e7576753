//! Objects a failed multi-object upload put and then could not delete (the
//! server gone for its deletes as for its upload): recorded in the upload
//! journal (`zt-uploads/` in the spool directory, beside the multipart
//! uploads [`crate::upload`] keeps) and deleted by the next write to their
//! prefix, so a store published there later does not find a failed one's
//! shards among its own.
//!
//! Only what a journal recorded is ever deleted, and only the version it
//! recorded: an entry whose object now has another ETag (someone wrote it
//! since) is dropped without deleting. An entry whose version is unknown
//! (the upload that failed may or may not have stored it) is deleted when
//! present. Nothing is deleted while the caller's `claimed` says the
//! prefix holds something whole (a store's `meta.zr`: its shards are
//! read through it, whoever put them).

use std::fs::File;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};

use crate::config::{spool_dir, RemoteConfig};
use crate::error::{Error, ErrorKind, Result};
use crate::list::{list, Listed};
use crate::upload::delete_object;

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

fn dir(config: &RemoteConfig) -> PathBuf {
    spool_dir(config).join("zt-uploads")
}

/// Record `left` in a journal of its own. The file's lock is released when
/// this returns: the entries are anyone's to clear from then on.
pub fn record(config: &RemoteConfig, left: &[Leftover]) -> Result<()> {
    // A URL or ETag holding a line break cannot be journaled line by line
    // (no store names one so); the rest still can.
    let text: String = left
        .iter()
        .filter(|l| !l.url.contains('\n') && !l.etag.as_deref().unwrap_or("").contains('\n'))
        .map(|l| format!("{}\n{}\n", l.url, l.etag.as_deref().unwrap_or("")))
        .collect();
    if text.is_empty() {
        return Ok(());
    }
    write_journal(&dir(config), &text)
}

fn write_journal(dir: &Path, text: &str) -> Result<()> {
    std::fs::create_dir_all(dir).map_err(|e| Error::io(dir.display(), e))?;
    let path = dir.join(format!(
        "{}-{:016x}.{EXTENSION}",
        std::process::id(),
        zt_fsutil::random_u64()
    ));
    let mut file = zt_fsutil::create_locked(&path).map_err(|e| Error::io(path.display(), e))?;
    file.write_all(text.as_bytes())
        .and_then(|()| file.sync_all())
        .map_err(|e| Error::io(path.display(), e))
}

fn parse(text: &str) -> Vec<Leftover> {
    let lines: Vec<&str> = text.lines().collect();
    lines
        .chunks_exact(2)
        .map(|pair| Leftover {
            url: pair[0].to_string(),
            etag: (!pair[1].is_empty()).then(|| pair[1].to_string()),
        })
        .collect()
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

/// Delete the recorded leftovers directly under `prefix_url` (journals of
/// any process, locked while this one works on them), before a write to
/// that prefix. While `claimed(listing)` is true of what the prefix holds
/// now, nothing is deleted and the entries stay. Returns the URLs deleted;
/// entries whose delete fails stay journaled.
pub fn clear_under(
    prefix_url: &str,
    config: &RemoteConfig,
    claimed: impl Fn(&[Listed]) -> bool,
) -> Result<Vec<String>> {
    let prefix = format!("{}/", prefix_url.trim_end_matches('/'));
    let mut deleted = Vec::new();
    let Ok(entries) = std::fs::read_dir(dir(config)) else {
        return Ok(deleted);
    };
    let mut listing: Option<Vec<Listed>> = None;
    for entry in entries.flatten() {
        let path = entry.path();
        if path.extension().is_none_or(|e| e != EXTENSION) {
            continue;
        }
        let Ok(mut file) = File::open(&path) else {
            continue;
        };
        // Another process clearing (or still writing) it: leave it.
        if !zt_fsutil::try_lock(&file, true).unwrap_or(false) {
            continue;
        }
        let mut text = String::new();
        if file.read_to_string(&mut text).is_err() {
            continue;
        }
        let all = parse(&text);
        let (mine, others): (Vec<Leftover>, Vec<Leftover>) = all.into_iter().partition(|l| {
            l.url
                .strip_prefix(&prefix)
                .is_some_and(|n| !n.contains('/'))
        });
        if mine.is_empty() {
            continue;
        }
        let listed = match &listing {
            Some(l) => l,
            None => listing.insert(list(prefix_url, config)?),
        };
        let mut kept = others;
        let mine = if claimed(listed) {
            kept.extend(mine);
            Vec::new()
        } else {
            mine
        };
        for left in mine {
            let name = &left.url[prefix.len()..];
            let Some(now) = listed.iter().find(|l| l.name == name) else {
                continue; // gone already
            };
            let ours = match (&left.etag, &now.etag) {
                (Some(put), Some(there)) => same_etag(put, there),
                (Some(_), None) => false,
                (None, _) => true,
            };
            if !ours {
                continue; // another version: not this journal's to delete
            }
            match delete_object(&left.url, config) {
                Ok(()) => deleted.push(left.url),
                Err(e) if e.kind == ErrorKind::NotFound => {}
                Err(_) => kept.push(left),
            }
        }
        if !kept.is_empty() {
            let text: String = kept
                .iter()
                .map(|l| format!("{}\n{}\n", l.url, l.etag.as_deref().unwrap_or("")))
                .collect();
            write_journal(&dir(config), &text)?;
        }
        let _ = std::fs::remove_file(&path);
    }
    Ok(deleted)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_round_trip_and_etags_compare_unquoted() {
        let left = [
            Leftover {
                url: "s3://b/p/data_1.zr".into(),
                etag: Some("\"abc\"".into()),
            },
            Leftover {
                url: "s3://b/p/data_2.zr".into(),
                etag: None,
            },
        ];
        let text: String = left
            .iter()
            .map(|l| format!("{}\n{}\n", l.url, l.etag.as_deref().unwrap_or("")))
            .collect();
        assert_eq!(parse(&text), left);
        assert!(same_etag("\"abc\"", "abc"));
        assert!(same_etag("W/\"abc\"", "\"abc\""));
        assert!(!same_etag("\"abc\"", "\"abd\""));
    }

    #[test]
    fn a_journal_of_other_prefixes_is_left_alone() {
        let spool =
            std::env::temp_dir().join(format!("zt-leftovers-{:016x}", zt_fsutil::random_u64()));
        let config = RemoteConfig {
            spool_dir: Some(spool.clone()),
            ..RemoteConfig::default()
        };
        record(
            &config,
            &[Leftover {
                url: "s3://b/other/data_0.zr".into(),
                etag: None,
            }],
        )
        .unwrap();
        // Nothing under s3://b/p is journaled: no listing, no delete, the
        // journal kept as it was.
        assert_eq!(
            clear_under("s3://b/p", &config, |_| false).unwrap(),
            Vec::<String>::new()
        );
        let kept: Vec<_> = std::fs::read_dir(dir(&config)).unwrap().flatten().collect();
        assert_eq!(kept.len(), 1);
        let _ = std::fs::remove_dir_all(&spool);
    }
}
