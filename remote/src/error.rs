//! One error type for object-storage access: a kind per reason a caller
//! acts on differently, the URL, and the detail the server or client gave.
//! The kind is the one every crate above reports a remote failure with
//! (`zt_core::RemoteKind` and `zrecord::RemoteKind` are this type), so this
//! module builds without the `client` feature: no object_store, no tokio.

use std::fmt;

/// Result alias for this crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Why a request failed, as a caller acts on it. Crates that keep the
/// failure as a remote one (`zt_core::Error::Remote`) turn `NotFound` and
/// `Memory` into their own not-found and memory errors instead.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    /// The object (or bucket) does not exist.
    NotFound,
    /// The credentials were refused or lack the permission.
    PermissionDenied,
    /// The object was replaced while it was being read (its ETag changed):
    /// nothing read so far may be mixed with what a retry would return.
    Changed,
    /// The server answered with a body or range other than the one asked
    /// for (short body, wrong `Content-Range`, 416 for an in-bounds range).
    BadResponse,
    /// A URL, option or credential file zt cannot use.
    Config,
    /// The operation is not possible on this kind of store (a write to a
    /// plain HTTP server).
    Unsupported,
    /// A network or server failure that persisted through the retries, or a
    /// local I/O error (spool or cache files).
    Io,
    /// The buffer for the bytes asked for could not be allocated (the
    /// process's memory or address-space limit): an error, never an abort.
    Memory {
        /// Bytes asked for.
        bytes: u64,
    },
}

/// An object-storage error.
#[derive(Debug)]
pub struct Error {
    /// Why it failed.
    pub kind: ErrorKind,
    /// The URL (or option) concerned.
    pub url: String,
    /// What the server or client said.
    pub detail: String,
}

impl Error {
    /// An error of `kind` about `url`.
    pub fn new(kind: ErrorKind, url: impl Into<String>, detail: impl Into<String>) -> Error {
        Error {
            kind,
            url: url.into(),
            detail: detail.into(),
        }
    }

    /// Classify an `object_store` error about `url`.
    #[cfg(feature = "client")]
    pub fn from_store(url: &str, e: object_store::Error) -> Error {
        use object_store::Error as E;
        let kind = match &e {
            E::NotFound { .. } => ErrorKind::NotFound,
            E::PermissionDenied { .. } | E::Unauthenticated { .. } => ErrorKind::PermissionDenied,
            E::Precondition { .. } => ErrorKind::Changed,
            E::NotSupported { .. } | E::NotImplemented { .. } => ErrorKind::Unsupported,
            E::UnknownConfigurationKey { .. } | E::InvalidPath { .. } => ErrorKind::Config,
            _ if is_bad_range(&e) => ErrorKind::BadResponse,
            _ => ErrorKind::Io,
        };
        let detail = match kind {
            ErrorKind::Changed => {
                format!("the object changed while it was read (ETag mismatch): {e}")
            }
            _ => e.to_string(),
        };
        Error::new(kind, url, detail)
    }

    /// No memory for a `bytes`-long buffer reading `url`.
    pub fn memory(url: impl Into<String>, bytes: u64) -> Error {
        Error::new(
            ErrorKind::Memory { bytes },
            url,
            format!("cannot allocate {bytes} bytes for the bytes read"),
        )
    }

    /// A local I/O error (spool, cache) about `path`.
    pub fn io(path: impl fmt::Display, e: std::io::Error) -> Error {
        Error::new(ErrorKind::Io, path.to_string(), e.to_string())
    }
}

/// object_store reports a response whose range does not match the request
/// ("Requested a..b, got c..d"), a missing or unparsable `Content-Range`, or
/// a 416 as a generic error of a private type; its text is the only way to
/// tell them from network failures.
#[cfg(feature = "client")]
fn is_bad_range(e: &object_store::Error) -> bool {
    let text = e.to_string();
    [
        "416",
        "Range Not Satisfiable",
        "Content-Range",
        "CONTENT_RANGE",
        "Requested ",
        "range",
    ]
    .iter()
    .any(|needle| text.contains(needle))
}

impl fmt::Display for ErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ErrorKind::NotFound => "not found",
            ErrorKind::PermissionDenied => "permission denied",
            ErrorKind::Changed => "object changed during read",
            ErrorKind::BadResponse => "bad response",
            ErrorKind::Config => "bad object-storage configuration",
            ErrorKind::Unsupported => "unsupported",
            ErrorKind::Io => "request failed",
            ErrorKind::Memory { .. } => "out of memory",
        })
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}: {}", self.url, self.kind, self.detail)
    }
}

impl std::error::Error for Error {}
