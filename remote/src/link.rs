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
//! The part size of a read is derived from them too ([`Link::read_part`]):
//! a read's parts are all in flight together (within the budget), so their
//! first-byte latencies overlap instead of adding up, and a read of `T`
//! bytes finishes soonest when it is split into as many parts as it keeps
//! in flight (`concurrency`), each `T / concurrency`. Two bounds: no part
//! is larger than `part_size` (a large model's parts stay the configured
//! size, AWS's 8-16 MiB guidance), and none is smaller than a floor below
//! which a request's cost would dominate its transfer: the bytes one
//! first-byte latency would have downloaded (the gap above, so a part takes
//! at least as long to arrive as to start), and never under
//! [`MIN_READ_PART`], since signing, the server's lookup and request
//! pricing cost per request whatever the latency. Until the link is
//! measured the floor is [`UNMEASURED_READ_PART_FLOOR`]. A small model thus
//! comes in several parts at once instead of one or two of `part_size`.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use crate::config::{RemoteConfig, DEFAULT_COALESCE_GAP};
use crate::url::{ObjectUrl, Scheme};

/// The smallest part a read is split into, however cheap requests
/// measure: below it the per-request work the first-byte latency does not
/// show (signing, parsing, the request's price) outweighs the overlap.
pub const MIN_READ_PART: u64 = 4 << 20;
/// The floor of a read's parts before the link is measured: the low end of
/// AWS's 8-16 MiB guidance (at S3's first byte and per-connection rate, a
/// part of about this size arrives in as long as it takes to start).
pub const UNMEASURED_READ_PART_FLOOR: u64 = 8 << 20;

/// A read's part size is rounded up to a multiple of this.
const READ_PART_STEP: u64 = 1 << 20;

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

    /// The part size for a read of `total` bytes under `config`: enough
    /// parts (of whole MiB) to keep `concurrency` requests in flight, each
    /// at least the floor (the measured gap, at least [`MIN_READ_PART`];
    /// before any measurement [`UNMEASURED_READ_PART_FLOOR`]) and at most
    /// `part_size`, which wins over the floor when it is set smaller.
    pub fn read_part(&self, config: &RemoteConfig, total: u64) -> u64 {
        let floor = self
            .gap()
            .map_or(UNMEASURED_READ_PART_FLOOR, |g| g.max(MIN_READ_PART));
        let ways = config.concurrency.min(config.inflight_requests).max(1) as u64;
        // Whole MiB: tensors are commonly whole MiB long, and a part a few
        // bytes short of a tensor's share leaves it a sliver of a request.
        total
            .div_ceil(ways)
            .max(floor)
            .next_multiple_of(READ_PART_STEP)
            .min(config.part_size)
            .max(1)
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
    fn a_read_is_split_to_keep_its_requests_in_flight() {
        const MIB: u64 = 1 << 20;
        let link = Link::default();
        let config = RemoteConfig::default();
        // Unmeasured: parts of at least 8 MiB (64 MiB in 8, as boto3 does).
        assert_eq!(link.read_part(&config, 64 * MIB), 8 * MIB);
        assert_eq!(link.read_part(&config, 3 * MIB), 8 * MIB);
        // 20 ms at 32 MiB/s: the gap (0.64 MiB) is under the 4 MiB minimum;
        // 64 MiB comes in 16 parts of 4 MiB, 256 MiB and more in parts of
        // the configured 16 MiB.
        link.record(20 * MS, 32 * MIB, Duration::from_secs(1));
        assert_eq!(link.read_part(&config, 64 * MIB), 4 * MIB);
        assert_eq!(link.read_part(&config, 100 * MIB), 7 * MIB); // 6.25 rounded up
                                                                 // 256 MiB less what the open cached: 16 MiB, not just under it
                                                                 // (which would cut each 64 MiB tensor into four parts and a sliver).
        assert_eq!(link.read_part(&config, 256 * MIB - (5 << 18)), 16 * MIB);
        assert_eq!(link.read_part(&config, 64 * MIB - (5 << 18)), 4 * MIB);
        assert_eq!(link.read_part(&config, 256 * MIB), 16 * MIB);
        assert_eq!(link.read_part(&config, 1 << 30), 16 * MIB);
        assert_eq!(link.read_part(&config, 1), 4 * MIB);
        // S3-like, 100 ms at 80 MiB/s: parts of at least the 8 MiB gap.
        let s3 = Link::default();
        s3.record(100 * MS, 80 * MIB, Duration::from_secs(1));
        assert_eq!(s3.read_part(&config, 64 * MIB), 8 * MIB);
        // Fewer requests in flight: fewer, larger parts; a smaller
        // part_size wins over the floor.
        let narrow = RemoteConfig {
            concurrency: 4,
            ..RemoteConfig::default()
        };
        assert_eq!(link.read_part(&narrow, 64 * MIB), 16 * MIB);
        let small = RemoteConfig {
            part_size: MIB,
            ..RemoteConfig::default()
        };
        assert_eq!(link.read_part(&small, 64 * MIB), MIB);
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
