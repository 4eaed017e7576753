//! # zt-remote: object storage for zt
//!
//! Reading objects of S3-compatible stores (`s3://bucket/key`) and of HTTP
//! servers that honour `Range` (`https://host/path`) the way a tensor
//! reader needs: metadata in one or two concurrent requests, structure
//! walks from a small cache, tensor bytes by parallel ranged GETs straight
//! into the caller's buffer, every request pinned to the version opened;
//! uploads by multipart upload, invisible until complete; a local cache of
//! whole objects; and listing for multi-object stores.
//!
//! Built on `object_store` with a private tokio runtime behind a blocking
//! API (callers release the GIL around it), fork-safe.

#![deny(missing_docs)]

pub mod cache;
pub mod config;
pub mod error;
pub mod list;
pub mod object;
pub mod plan;
pub mod runtime;
pub mod upload;
pub mod url;

pub use config::RemoteConfig;
pub use error::{Error, ErrorKind, Result};
pub use object::RemoteObject;
pub use runtime::{stats, StatsSnapshot};
pub use upload::{upload_file, Spool};
pub use url::ObjectUrl;
