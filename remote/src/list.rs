//! Listing the objects directly under a prefix (one level, like a
//! directory), for stores made of several objects (zrecord's `meta.zr` and
//! `data_N.zr`).

use futures::TryStreamExt;

use crate::config::RemoteConfig;
use crate::error::{Error, ErrorKind, Result};
use crate::runtime::{block_on_store, stats, store_for, Stats};
use crate::url::{ObjectUrl, Scheme};

/// One object of a listing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Listed {
    /// The name relative to the listed prefix.
    pub name: String,
    /// Size in bytes.
    pub size: u64,
    /// ETag, if the server gave one.
    pub etag: Option<String>,
}

/// The objects directly under `prefix_url` (`s3://bucket/dir`,
/// `gs://bucket/dir`, `az://container/dir`), sorted by
/// name.
pub fn list(prefix_url: &str, config: &RemoteConfig) -> Result<Vec<Listed>> {
    let url = ObjectUrl::parse(prefix_url)?;
    if url.scheme == Scheme::Http {
        return Err(Error::new(
            ErrorKind::Unsupported,
            prefix_url,
            "listing needs object storage (s3://, gs://, az://); plain HTTP servers cannot list",
        ));
    }
    let store = store_for(&url, config)?;
    let prefix = url.key.trim_end_matches('/').to_string();
    Stats::count(&stats().lists, 1);
    let path = url.path();
    let result = block_on_store(
        prefix_url,
        store.list_with_delimiter((!prefix.is_empty()).then_some(&path)),
    )?;
    let strip = if prefix.is_empty() {
        String::new()
    } else {
        format!("{prefix}/")
    };
    let mut out: Vec<Listed> = result
        .objects
        .into_iter()
        .filter_map(|m| {
            let key = m.location.to_string();
            key.strip_prefix(&strip).map(|name| Listed {
                name: name.to_string(),
                size: m.size,
                etag: m.e_tag.clone(),
            })
        })
        .collect();
    out.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(out)
}

/// Every object key under `prefix_url`, recursively (for tests and
/// cleanup; pages through the listing).
pub fn list_all(prefix_url: &str, config: &RemoteConfig) -> Result<Vec<String>> {
    let url = ObjectUrl::parse(prefix_url)?;
    let store = store_for(&url, config)?;
    Stats::count(&stats().lists, 1);
    let path = url.path();
    let keys = block_on_store(
        prefix_url,
        store
            .list(if url.key.is_empty() {
                None
            } else {
                Some(&path)
            })
            .map_ok(|m| m.location.to_string())
            .try_collect::<Vec<String>>(),
    )?;
    Ok(keys)
}
