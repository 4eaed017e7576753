//! Listing the objects directly under a prefix (one level, like a
//! directory), for stores made of several objects (zrecord's `meta.zr` and
//! `data_N.zr`).
//!
//! A listing is retried as a GET is: object_store retries a failed request
//! (transport errors, 5xx, throttling), and a body cut off, stalled
//! (`idle_timeout`) or unparsable after a successful response, which
//! object_store does not retry for a listing, is listed again here, with
//! backoff, within `max_retries` and `retry_timeout`.

use std::future::Future;
use std::time::{Duration, Instant};

use futures::TryStreamExt;

use crate::config::RemoteConfig;
use crate::error::{Error, ErrorKind, Result};
use crate::runtime::{block_on, stats, store_for, Stats};
use crate::url::{ObjectUrl, Scheme};
use crate::watch;

/// The wait before retry `n` (from 1): 100 ms doubling to at most 15 s
/// (object_store's backoff), scaled by a random factor in [0.5, 1).
fn backoff(n: usize) -> Duration {
    let base = Duration::from_millis(100).saturating_mul(1 << n.saturating_sub(1).min(8) as u32);
    let base = base.min(Duration::from_secs(15));
    let jitter = 0.5 + (zt_fsutil::random_u64() >> 11) as f64 / (1u64 << 54) as f64;
    base.mul_f64(jitter)
}

/// Run the listing `attempt` makes until it succeeds, listing again when
/// an attempt failed after a successful response.
fn retried<T, F, Fut>(url: &str, config: &RemoteConfig, mut attempt: F) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = object_store::Result<T>>,
{
    let start = Instant::now();
    let mut retries = 0;
    loop {
        let outcome = block_on(watch::scoped(async {
            attempt()
                .await
                .map_err(|e| (Error::from_store(url, e), watch::failed_after_response()))
        }))?;
        match outcome {
            Ok(listed) => return Ok(listed),
            Err((_, true))
                if retries < config.max_retries && start.elapsed() < config.retry_timeout =>
            {
                retries += 1;
                Stats::count(&stats().retries, 1);
                std::thread::sleep(backoff(retries));
            }
            Err((e, _)) => return Err(e),
        }
    }
}

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
    let (result, strip) = delimited(prefix_url, config)?;
    Ok(listed(result.objects, &strip))
}

/// The names of the "directories" directly under `prefix_url`: the
/// common prefixes a delimited listing returns (zarr's groups and arrays,
/// whose keys hold `/`), without the listed prefix or a trailing `/`,
/// sorted.
pub fn list_prefixes(prefix_url: &str, config: &RemoteConfig) -> Result<Vec<String>> {
    let (result, strip) = delimited(prefix_url, config)?;
    let mut out: Vec<String> = result
        .common_prefixes
        .into_iter()
        .filter_map(|p| {
            let key = p.to_string();
            let name = key.strip_prefix(&strip)?.trim_end_matches('/');
            (!name.is_empty()).then(|| name.to_string())
        })
        .collect();
    out.sort();
    Ok(out)
}

/// One delimited listing of `prefix_url` (retried as [`retried`] says),
/// with the key prefix its names start with (`dir/`; empty at the root).
fn delimited(
    prefix_url: &str,
    config: &RemoteConfig,
) -> Result<(object_store::ListResult, String)> {
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
    let result = retried(prefix_url, config, || {
        store.list_with_delimiter((!prefix.is_empty()).then_some(&path))
    })?;
    let strip = if prefix.is_empty() {
        String::new()
    } else {
        format!("{prefix}/")
    };
    Ok((result, strip))
}

/// Every object under `prefix_url` at any depth, named relative to it
/// (`sub/file`), with sizes and ETags, sorted by name: a directory
/// output's files (a checkpoint's, whose writer may nest them).
pub fn list_tree(prefix_url: &str, config: &RemoteConfig) -> Result<Vec<Listed>> {
    let url = ObjectUrl::parse(prefix_url)?;
    let store = store_for(&url, config)?;
    let prefix = url.key.trim_end_matches('/').to_string();
    let strip = if prefix.is_empty() {
        String::new()
    } else {
        format!("{prefix}/")
    };
    Stats::count(&stats().lists, 1);
    let path = url.path();
    let objects = retried(prefix_url, config, || {
        store
            .list((!prefix.is_empty()).then_some(&path))
            .try_collect::<Vec<object_store::ObjectMeta>>()
    })?;
    Ok(listed(objects, &strip))
}

/// `objects` named relative to the listed prefix (`strip`, with its
/// trailing `/`), sorted by name; keys outside it are dropped.
fn listed(objects: Vec<object_store::ObjectMeta>, strip: &str) -> Vec<Listed> {
    let mut out: Vec<Listed> = objects
        .into_iter()
        .filter_map(|m| {
            let key = m.location.to_string();
            key.strip_prefix(strip).map(|name| Listed {
                name: name.to_string(),
                size: m.size,
                etag: m.e_tag,
            })
        })
        .collect();
    out.sort_by(|a, b| a.name.cmp(&b.name));
    out
}
