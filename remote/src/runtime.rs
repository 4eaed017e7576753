//! The private async runtime behind zt's blocking API, and the stores it
//! talks to.
//!
//! A forked child (a DataLoader worker started with `fork`) must not touch
//! its parent's runtime or connection pools: their threads did not survive
//! the fork. Both are keyed by process id, so a child builds its own on
//! first use. (The parent's copies are leaked in the child, never dropped:
//! dropping them would try to join threads that do not exist there.)

use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use object_store::aws::AmazonS3;
use object_store::azure::MicrosoftAzure;
use object_store::gcp::GoogleCloudStorage;
use object_store::multipart::MultipartStore;
use object_store::ObjectStore;
use tokio::runtime::Runtime;

use crate::config::RemoteConfig;
use crate::error::{Error, Result};
use crate::url::{ObjectUrl, Scheme};

/// Worker threads of the runtime: I/O bound, so a few are enough.
const RUNTIME_THREADS: usize = 2;

/// A built store, kept with its concrete type where a caller needs more
/// than `ObjectStore` (multipart uploads by id, to abort orphans).
#[derive(Clone, Debug)]
pub enum Backend {
    /// An S3-compatible store.
    S3(Arc<AmazonS3>),
    /// Google Cloud Storage (its XML API: ranged GETs, multipart uploads).
    Gcs(Arc<GoogleCloudStorage>),
    /// Azure Blob Storage (block blobs: a multipart upload is blocks
    /// committed by one block list).
    Azure(Arc<MicrosoftAzure>),
    /// A plain HTTP server.
    Http(Arc<dyn ObjectStore>),
}

impl Backend {
    /// The store as an `ObjectStore`.
    pub fn store(&self) -> Arc<dyn ObjectStore> {
        match self {
            Backend::S3(s3) => Arc::clone(s3) as Arc<dyn ObjectStore>,
            Backend::Gcs(gcs) => Arc::clone(gcs) as Arc<dyn ObjectStore>,
            Backend::Azure(azure) => Arc::clone(azure) as Arc<dyn ObjectStore>,
            Backend::Http(http) => Arc::clone(http),
        }
    }

    /// The store's multipart uploads by id: every backend but plain HTTP,
    /// which is read-only.
    pub fn multipart(&self) -> Option<Arc<dyn MultipartStore>> {
        match self {
            Backend::S3(s3) => Some(Arc::clone(s3) as Arc<dyn MultipartStore>),
            Backend::Gcs(gcs) => Some(Arc::clone(gcs) as Arc<dyn MultipartStore>),
            Backend::Azure(azure) => Some(Arc::clone(azure) as Arc<dyn MultipartStore>),
            Backend::Http(_) => None,
        }
    }
}

struct PerProcess {
    pid: u32,
    runtime: Arc<Runtime>,
    stores: HashMap<(Scheme, String, RemoteConfig), Backend>,
}

fn state() -> &'static Mutex<Option<PerProcess>> {
    static STATE: OnceLock<Mutex<Option<PerProcess>>> = OnceLock::new();
    STATE.get_or_init(|| Mutex::new(None))
}

/// The current process's entry, created (or re-created after a fork) on
/// first use.
fn with_state<T>(f: impl FnOnce(&mut PerProcess) -> Result<T>) -> Result<T> {
    let mut guard = state().lock().unwrap_or_else(|p| p.into_inner());
    let pid = std::process::id();
    if guard.as_ref().is_none_or(|s| s.pid != pid) {
        // rustls needs a process-wide crypto provider; installing twice is
        // harmless (the second call reports the first).
        let _ = rustls::crypto::ring::default_provider().install_default();
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(RUNTIME_THREADS)
            .thread_name("zt-remote")
            .enable_all()
            .build()
            .map_err(|e| Error::io("the object-storage runtime", e))?;
        if let Some(inherited) = guard.take() {
            std::mem::forget(inherited);
        }
        *guard = Some(PerProcess {
            pid,
            runtime: Arc::new(runtime),
            stores: HashMap::new(),
        });
    }
    f(guard.as_mut().expect("set above"))
}

/// This process's runtime.
pub(crate) fn runtime() -> Result<Arc<Runtime>> {
    with_state(|s| Ok(Arc::clone(&s.runtime)))
}

/// Run `future` to completion on the runtime, blocking this thread.
pub fn block_on<F: Future>(future: F) -> Result<F::Output> {
    Ok(runtime()?.block_on(future))
}

/// The store serving `url`'s bucket or origin under `config` (built once
/// per process and reused, so connections are pooled).
pub fn backend_for(url: &ObjectUrl, config: &RemoteConfig) -> Result<Backend> {
    with_state(|s| {
        let key = (url.scheme, url.root.clone(), config.clone());
        if let Some(backend) = s.stores.get(&key) {
            return Ok(backend.clone());
        }
        let backend = match url.scheme {
            Scheme::S3 => Backend::S3(Arc::new(config.s3_store(&url.root)?)),
            Scheme::Gcs => Backend::Gcs(Arc::new(config.gcs_store(&url.root)?)),
            Scheme::Azure => Backend::Azure(Arc::new(config.azure_store(&url.root)?)),
            Scheme::Http => Backend::Http(config.http_store(&url.root)?),
        };
        s.stores.insert(key, backend.clone());
        Ok(backend)
    })
}

/// Run one object_store operation on the runtime, as one operation of
/// `crate::watch` (its errors classified by its own responses), its
/// error about `url`.
pub fn block_on_store<T>(
    url: &str,
    future: impl Future<Output = object_store::Result<T>>,
) -> Result<T> {
    block_on(crate::watch::scoped(async move {
        future.await.map_err(|e| Error::from_store(url, e))
    }))?
}

/// [`backend_for`] as an `ObjectStore`.
pub fn store_for(url: &ObjectUrl, config: &RemoteConfig) -> Result<Arc<dyn ObjectStore>> {
    backend_for(url, config).map(|b| b.store())
}

/// Counts of the requests this process has sent, for tests and benchmarks:
/// each request once, however many attempts it took, and the attempts
/// beyond the first in `retries` (object_store's own retries of a failed
/// attempt, of a body cut off or stalled, and zt's of a listing).
#[derive(Debug, Default)]
pub struct Stats {
    /// Ranged or whole GETs.
    pub gets: AtomicU64,
    /// HEAD requests.
    pub heads: AtomicU64,
    /// PUTs, multipart requests (create, part, complete, abort) and DELETEs.
    pub puts: AtomicU64,
    /// LIST requests (pages).
    pub lists: AtomicU64,
    /// Attempts that repeated a failed one (a transport error, a 5xx, 429
    /// or 408, a body cut off or stalled).
    pub retries: AtomicU64,
    /// Body bytes received.
    pub bytes_in: AtomicU64,
    /// Body bytes sent.
    pub bytes_out: AtomicU64,
}

/// A snapshot of [`Stats`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StatsSnapshot {
    /// GETs.
    pub gets: u64,
    /// HEADs.
    pub heads: u64,
    /// PUTs and multipart requests.
    pub puts: u64,
    /// LIST pages.
    pub lists: u64,
    /// Retried attempts.
    pub retries: u64,
    /// Bytes received.
    pub bytes_in: u64,
    /// Bytes sent.
    pub bytes_out: u64,
}

/// This process's request counters.
pub fn stats() -> &'static Stats {
    static STATS: OnceLock<Stats> = OnceLock::new();
    STATS.get_or_init(Stats::default)
}

impl Stats {
    /// Read every counter.
    pub fn snapshot(&self) -> StatsSnapshot {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        StatsSnapshot {
            gets: get(&self.gets),
            heads: get(&self.heads),
            puts: get(&self.puts),
            lists: get(&self.lists),
            retries: get(&self.retries),
            bytes_in: get(&self.bytes_in),
            bytes_out: get(&self.bytes_out),
        }
    }

    /// Count one request of a kind.
    pub(crate) fn count(counter: &AtomicU64, n: u64) {
        counter.fetch_add(n, Ordering::Relaxed);
    }
}
