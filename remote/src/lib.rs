//! # zt-remote: object storage for zt
//!
//! Reading objects of S3-compatible stores (`s3://bucket/key`), Google Cloud
//! Storage (`gs://bucket/key`), Azure Blob Storage (`az://container/key`,
//! `abfs://`) and of HTTP servers that honour `Range`
//! (`https://host/path`) the way a tensor
//! reader needs: metadata in one or two concurrent requests, structure
//! walks from a small cache, tensor bytes by parallel ranged GETs straight
//! into the caller's buffer, every request pinned to the version opened;
//! uploads by multipart upload, invisible until complete; a local cache of
//! whole objects; and listing for multi-object stores.
//!
//! Built on `object_store` with a private tokio runtime behind a blocking
//! API (callers release the GIL around it), fork-safe.
//!
//! All of that is the `client` feature (on by default). Without it the
//! crate is its [`error`] module alone: the [`ErrorKind`] the core and the
//! record stores report remote failures with, in every build of theirs.

#![deny(missing_docs)]

#[cfg(feature = "client")]
pub mod cache;
#[cfg(feature = "client")]
pub mod config;
pub mod error;
#[cfg(feature = "client")]
pub mod fetch;
#[cfg(feature = "client")]
pub mod leftovers;
#[cfg(feature = "client")]
pub mod link;
#[cfg(feature = "client")]
pub mod list;
#[cfg(feature = "client")]
pub mod object;
#[cfg(feature = "client")]
pub mod openings;
#[cfg(feature = "client")]
pub mod plan;
#[cfg(feature = "client")]
pub mod runtime;
#[cfg(feature = "client")]
pub mod upload;
#[cfg(feature = "client")]
pub mod url;
#[cfg(feature = "client")]
mod watch;

pub use error::{Error, ErrorKind, Result};

/// The URL schemes object storage serves (`url::ObjectUrl` parses each),
/// for callers that tell a URL from a local path without the client.
pub const URL_SCHEMES: &[&str] = &[
    "s3://", "gs://", "gcs://", "az://", "abfs://", "abfss://", "http://", "https://",
];
#[cfg(feature = "client")]
pub use {
    config::RemoteConfig,
    object::RemoteObject,
    runtime::{stats, StatsSnapshot},
    upload::{delete_object, upload_file, upload_file_versioned, Spool},
    url::ObjectUrl,
};
