//! What a request costs on the connection to one store, measured on every
//! ranged GET: the time to its response's head (the first-byte latency:
//! signing, the round trip, the server's lookup) and the rate its body
//! arrives at. Both are running averages (each sample weighs a quarter), so
//! the estimate follows a connection that gets slower or faster.
//!
//! Their product is the coalescing gap when the caller sets none
//! (`coalesce_gap` unset): the bytes one request's latency would have
//! downloaded. Fetching a gap shorter than that costs less time than a
//! request of its own; a longer one costs more. On loopback (a request
//! costs well under a millisecond) that is tens of KiB; against S3 (first
//! byte 50-200 ms at 50-90 MB/s per connection) several MiB, then capped by
//! the part size and by the read-amplification bound
//! (`max_amplification`, [`crate::plan`]), which keeps a gather of small
//! scattered records from downloading the store between them. Until the
//! first GET is measured (an object's open measures itself) the gap is
//! [`DEFAULT_COALESCE_GAP`].
//!
//! The part size of large reads is not derived from the measurements: a
//! large read's parts are all in flight together (within the budget), so
//! their first-byte latencies overlap instead of adding up, and a part
//! need only be large enough that signing and the server's per-request
//! work stay small beside its transfer, which the configured size (AWS's
//! 8-16 MiB guidance) already is.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use crate::config::{RemoteConfig, DEFAULT_COALESCE_GAP};
use crate::url::{ObjectUrl, Scheme};

/// Bodies shorter than this give no rate sample: their time is mostly the
/// last round trip's, not the transfer's.
const RATE_SAMPLE_BYTES: u64 = 64 << 10;

/// The measured cost of requests to one store.
#[derive(Debug, Default)]
pub struct Link {
    /// First-byte latency in nanoseconds (0: not measured yet).
    latency_ns: AtomicU64,
    /// Body bytes per second (0: not measured yet).
    rate: AtomicU64,
}

/// Fold `sample` into the running average in `cell` (the first sample is
/// taken as it is). Concurrent updates may lose one another's sample,
/// which only slows the average down.
fn fold(cell: &AtomicU64, sample: u64) {
    let old = cell.load(Ordering::Relaxed);
    let new = if old == 0 {
        sample
    } else {
        old - old / 4 + sample / 4
    };
    cell.store(new.max(1), Ordering::Relaxed);
}

impl Link {
    /// Record one GET: `first_byte` from sending it to its response's head,
    /// then `body` bytes in `body_time`.
    pub fn record(&self, first_byte: Duration, body: u64, body_time: Duration) {
        fold(
            &self.latency_ns,
            u64::try_from(first_byte.as_nanos()).unwrap_or(u64::MAX),
        );
        let secs = body_time.as_secs_f64();
        if body >= RATE_SAMPLE_BYTES && secs > 0.0 {
            fold(&self.rate, (body as f64 / secs) as u64);
        }
    }

    /// The measured first-byte latency.
    pub fn latency(&self) -> Option<Duration> {
        match self.latency_ns.load(Ordering::Relaxed) {
            0 => None,
            ns => Some(Duration::from_nanos(ns)),
        }
    }

    /// The measured body rate, bytes per second.
    pub fn rate(&self) -> Option<u64> {
        match self.rate.load(Ordering::Relaxed) {
            0 => None,
            rate => Some(rate),
        }
    }

    /// The bytes one request's latency would have downloaded, once both are
    /// measured.
    pub fn gap(&self) -> Option<u64> {
        let (latency, rate) = (self.latency()?, self.rate()?);
        Some((latency.as_secs_f64() * rate as f64) as u64)
    }

    /// The coalescing gap for reads under `config`: the one it sets, else
    /// the measured one (at most a part), else [`DEFAULT_COALESCE_GAP`].
    pub fn coalesce_gap(&self, config: &RemoteConfig) -> u64 {
        config.coalesce_gap.unwrap_or_else(|| {
            self.gap()
                .map_or(DEFAULT_COALESCE_GAP, |g| g.min(config.part_size))
        })
    }
}

/// The measurements of the store serving `url` under `config` (its scheme,
/// bucket or origin, and the options that pick its endpoint and client),
/// shared by every object read from it.
pub fn link_for(url: &ObjectUrl, config: &RemoteConfig) -> Arc<Link> {
    type Links = HashMap<(Scheme, String, Vec<(String, String)>), Arc<Link>>;
    static LINKS: OnceLock<Mutex<Links>> = OnceLock::new();
    let key = (url.scheme, url.root.clone(), config.store_options.clone());
    let mut links = LINKS
        .get_or_init(Mutex::default)
        .lock()
        .unwrap_or_else(|p| p.into_inner());
    Arc::clone(links.entry(key).or_default())
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn the_gap_is_what_one_latency_downloads() {
        let link = Link::default();
        let config = RemoteConfig::default();
        assert_eq!(link.gap(), None);
        assert_eq!(link.coalesce_gap(&config), DEFAULT_COALESCE_GAP);
        // 20 ms to the first byte; 1 MiB in 10 ms (100 MiB/s): 2 MiB.
        link.record(20 * MS, 1 << 20, 10 * MS);
        assert_eq!(link.latency(), Some(20 * MS));
        assert_eq!(link.rate(), Some(100 << 20));
        assert_eq!(link.gap(), Some(2 << 20));
        // Small bodies update the latency only.
        link.record(60 * MS, 4096, MS);
        assert_eq!(link.latency(), Some(30 * MS));
        assert_eq!(link.rate(), Some(100 << 20));
        assert_eq!(link.gap(), Some(3 << 20));
        // Capped by the part size; the option, when set, wins.
        let small_parts = RemoteConfig {
            part_size: 1 << 20,
            ..RemoteConfig::default()
        };
        assert_eq!(link.coalesce_gap(&small_parts), 1 << 20);
        let fixed = RemoteConfig {
            coalesce_gap: Some(0),
            ..RemoteConfig::default()
        };
        assert_eq!(link.coalesce_gap(&fixed), 0);
    }

    #[test]
    fn one_link_per_store() {
        let config = RemoteConfig::default();
        let a = link_for(&ObjectUrl::parse("s3://b/x").unwrap(), &config);
        let b = link_for(&ObjectUrl::parse("s3://b/y/z").unwrap(), &config);
        let c = link_for(&ObjectUrl::parse("s3://other/x").unwrap(), &config);
        assert!(Arc::ptr_eq(&a, &b));
        assert!(!Arc::ptr_eq(&a, &c));
    }
}
