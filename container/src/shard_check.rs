//! The root of a sharded checkpoint vouches for each shard by its
//! whole-file digest (§7.1). Opening checks each shard's size (cheap); the
//! digest is a lazy check ([`zt_core::catalog::Check`]) on every object
//! stored in the shard, run once for the shard at the first read of any of
//! them, so open stays metadata-only and no tensor of a shard the root
//! does not vouch for (one from another save of the same size, left by a
//! torn overwrite) is ever returned.

use std::sync::{Arc, OnceLock};

use crate::rules;
use crate::verify::hash_store;
use zt_core::catalog::{Check, CheckFailed, Digest};
use zt_core::store::Store;

/// A shard's whole-file digest, checked once however many objects ask.
#[derive(Debug)]
pub(crate) struct ShardDigest {
    label: String,
    store: Arc<Store>,
    want: Digest,
    outcome: OnceLock<Result<(), CheckFailed>>,
}

impl ShardDigest {
    /// The check of the shard `label` opened as `store`, or `None` when
    /// its digest names an algorithm zt does not know (unverifiable, as
    /// `zt verify` treats it).
    pub(crate) fn new(label: &str, store: Arc<Store>, digest: &str) -> Option<ShardDigest> {
        Some(ShardDigest {
            label: label.to_string(),
            store,
            want: Digest::parse(digest).ok()?,
            outcome: OnceLock::new(),
        })
    }

    fn run(&self) -> Result<(), CheckFailed> {
        self.outcome
            .get_or_init(|| {
                let got =
                    hash_store(&self.store, self.want.algorithm()).map_err(|e| CheckFailed {
                        rule: rules::SHARD_IDENTITY,
                        reason: format!("shard {:?} could not be read: {e}", self.label),
                    })?;
                if got == self.want {
                    return Ok(());
                }
                Err(CheckFailed {
                    rule: rules::SHARD_IDENTITY,
                    reason: format!(
                        "shard {:?} ({}) digest is {got}, the root says {}: it is not the \
                         shard this root was written with",
                        self.label,
                        self.store.path().display(),
                        self.want
                    ),
                })
            })
            .clone()
    }
}

/// The digest checks of every shard an object is stored in (almost always
/// one).
#[derive(Debug)]
pub(crate) struct ShardsOfObject(pub(crate) Vec<Arc<ShardDigest>>);

impl Check for ShardsOfObject {
    fn check(&self) -> Result<(), CheckFailed> {
        self.0.iter().try_for_each(|s| s.run())
    }

    /// Hashing a remote shard would fetch it a second time: there only
    /// `verify` runs it (and `zt verify` / `verify_shards`).
    fn on_read(&self) -> bool {
        self.0.iter().all(|s| !s.store.is_remote())
    }
}
