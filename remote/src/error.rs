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

    /// Classify an `object_store` error about `url`, sent in the current
    /// operation (`crate::watch::scoped`): by the error's variant, then
    /// by the client's typed errors in its source chain and the status of
    /// the operation's latest response; never by the message's text (a key
    /// or a duration may spell anything).
    #[cfg(feature = "client")]
    pub fn from_store(url: &str, e: object_store::Error) -> Error {
        let kind = classify(&e, crate::watch::last_status());
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

/// The kind of an `object_store` error whose operation's latest response
/// had `status` (`None`: no response, the attempt failed before one).
///
/// object_store names not-found, refused credentials, failed preconditions
/// and unsupported operations by variant. Beyond those: one of the
/// client's transport errors in the source chain (`HttpError`,
/// `reqwest::Error`, a stall) is a network failure ([`ErrorKind::Io`]); a
/// 416 is [`ErrorKind::BadResponse`] (zt asks only for ranges inside the
/// object); any other error status is a server failure ([`ErrorKind::Io`]);
/// and an error after a successful response that was not the transport's
/// is object_store refusing what the server sent (a `Content-Range` other
/// than the range asked for, none, a 200 to a ranged GET, a listing it
/// cannot parse: its own error types are private), so
/// [`ErrorKind::BadResponse`].
#[cfg(feature = "client")]
pub(crate) fn classify(e: &object_store::Error, status: Option<u16>) -> ErrorKind {
    use object_store::Error as E;
    match e {
        E::NotFound { .. } => ErrorKind::NotFound,
        E::PermissionDenied { .. } | E::Unauthenticated { .. } => ErrorKind::PermissionDenied,
        E::Precondition { .. } => ErrorKind::Changed,
        E::NotSupported { .. } | E::NotImplemented { .. } => ErrorKind::Unsupported,
        E::UnknownConfigurationKey { .. } | E::InvalidPath { .. } => ErrorKind::Config,
        _ if crate::watch::is_transport(e) => ErrorKind::Io,
        _ => match status {
            Some(416) => ErrorKind::BadResponse,
            Some(s) if (200..300).contains(&s) => ErrorKind::BadResponse,
            _ => ErrorKind::Io,
        },
    }
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

#[cfg(all(test, feature = "client"))]
mod tests {
    use super::*;
    use object_store::client::{HttpError, HttpErrorKind};

    /// An error of object_store's own kind whose text says "range", "416",
    /// "Content-Range" and an elapsed time with "416" in it.
    #[derive(Debug)]
    struct Refusal;

    impl fmt::Display for Refusal {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("GET s3://b/orange/416 in 1.0441695s: Content-Range range")
        }
    }

    impl std::error::Error for Refusal {}

    fn generic(source: Box<dyn std::error::Error + Send + Sync>) -> object_store::Error {
        object_store::Error::Generic {
            store: "S3",
            source,
        }
    }

    fn network() -> object_store::Error {
        let refused = std::io::Error::new(std::io::ErrorKind::ConnectionRefused, Refusal);
        generic(Box::new(HttpError::new(HttpErrorKind::Connect, refused)))
    }

    #[test]
    fn errors_are_classified_by_type_and_status_never_by_text() {
        // A network error is Io whatever its text says, with or without a
        // response before it.
        for status in [None, Some(206), Some(416), Some(503)] {
            assert_eq!(classify(&network(), status), ErrorKind::Io, "{status:?}");
        }
        let e = Error::from_store("s3://b/orange/416", network());
        assert_eq!(e.kind, ErrorKind::Io, "{e}");
        assert!(e.to_string().contains("416"), "{e}");
        // object_store refusing a successful response (its own, private,
        // error types): a bad response; the same after a 416 too.
        assert_eq!(
            classify(&generic(Box::new(Refusal)), Some(206)),
            ErrorKind::BadResponse
        );
        assert_eq!(
            classify(&generic(Box::new(Refusal)), Some(416)),
            ErrorKind::BadResponse
        );
        // A server failure, or no response at all: Io.
        assert_eq!(
            classify(&generic(Box::new(Refusal)), Some(503)),
            ErrorKind::Io
        );
        assert_eq!(classify(&generic(Box::new(Refusal)), None), ErrorKind::Io);
        // Variants name themselves.
        let missing = object_store::Error::NotFound {
            path: "range/416".into(),
            source: Box::new(Refusal),
        };
        assert_eq!(classify(&missing, Some(404)), ErrorKind::NotFound);
    }
}
