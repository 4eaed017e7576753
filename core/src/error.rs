//! One error type for every plugin: a variant per reason, each carrying the
//! context a user needs to find the problem (file, tensor, byte offset).
//!
//! The variant is the category of the failure (it decides the message's
//! prefix, "malformed header", "bad data range", and whether the input is
//! at fault); every variant that refuses an input also carries the
//! [`Rule`] it failed, which [`Error::rule`] reads. Tests match on the
//! variant and the rule; the few that also match message text check what a
//! user reads (that a message names the file or the reason).

use std::fmt;
use std::path::{Path, PathBuf};

pub use crate::rule::Rule;

/// Result alias used across the crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Where in a file an error was found. Every field is optional because the
/// same reason can arise with or without a tensor in play.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Context {
    /// The file being read.
    pub file: Option<PathBuf>,
    /// The tensor (object) name, when the problem belongs to one.
    pub tensor: Option<String>,
    /// Byte offset in the file where the bad structure sits.
    pub offset: Option<u64>,
}

impl Context {
    /// Context naming a file only.
    pub fn file(path: impl AsRef<Path>) -> Self {
        Context {
            file: Some(path.as_ref().to_path_buf()),
            ..Context::default()
        }
    }

    /// The same context, naming a tensor.
    pub fn tensor(mut self, name: impl Into<String>) -> Self {
        self.tensor = Some(name.into());
        self
    }

    /// The same context, naming a byte offset.
    pub fn at(mut self, offset: u64) -> Self {
        self.offset = Some(offset);
        self
    }
}

impl fmt::Display for Context {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut sep = "";
        if let Some(file) = &self.file {
            write!(f, "{}", file.display())?;
            sep = ", ";
        }
        if let Some(tensor) = &self.tensor {
            write!(f, "{sep}tensor {tensor:?}")?;
            sep = ", ";
        }
        if let Some(offset) = self.offset {
            write!(f, "{sep}offset {offset}")?;
        }
        Ok(())
    }
}

/// Every way reading or writing a tensor file can fail.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// An operating-system error (open, read, map, write).
    #[error("{ctx}: {source}")]
    Io {
        /// Where it happened.
        ctx: Context,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// The file does not exist.
    #[error("{ctx}: no such file")]
    NotFound {
        /// The missing file.
        ctx: Context,
    },
    /// No registered format recognises the file's structure.
    #[error("{ctx}: not a recognised tensor file")]
    UnknownFormat {
        /// The file.
        ctx: Context,
    },
    /// The file ends before a structure it declares.
    #[error("{ctx}: truncated: {what} needs {needed} bytes, {available} available")]
    Truncated {
        /// Where.
        ctx: Context,
        /// The check it failed.
        rule: Rule,
        /// The structure that did not fit.
        what: &'static str,
        /// Bytes it needs.
        needed: u64,
        /// Bytes the file has there.
        available: u64,
    },
    /// A header, manifest or metadata block is malformed.
    #[error("{ctx}: malformed header: {reason}")]
    Header {
        /// Where.
        ctx: Context,
        /// The check it failed.
        rule: Rule,
        /// What is wrong: words, or a value of the wrong type as data
        /// ([`Reason::Mismatch`], [`Error::mismatch`]).
        reason: Reason,
    },
    /// A dtype string or code that the format or zt does not know.
    #[error("{ctx}: unsupported dtype {dtype:?}")]
    UnsupportedDType {
        /// Where.
        ctx: Context,
        /// The check it failed.
        rule: Rule,
        /// The dtype as the file spelled it.
        dtype: String,
    },
    /// Arithmetic on declared sizes overflowed (shape product, byte size, offset + length).
    #[error("{ctx}: size overflow computing {what}")]
    Overflow {
        /// Where.
        ctx: Context,
        /// The check it failed.
        rule: Rule,
        /// The quantity being computed.
        what: &'static str,
    },
    /// A tensor's byte range is inconsistent with its shape and dtype, lies
    /// outside the file, or overlaps / leaves gaps against its neighbours.
    #[error("{ctx}: bad data range: {reason}")]
    Range {
        /// Where.
        ctx: Context,
        /// The check it failed.
        rule: Rule,
        /// What is wrong.
        reason: String,
    },
    /// Two tensors share a name (within one file or across merged files).
    #[error("{ctx}: duplicate tensor name")]
    DuplicateName {
        /// Where (the tensor names the duplicate).
        ctx: Context,
    },
    /// A configured limit would be exceeded.
    #[error(
        "{ctx}: limit exceeded: {limit} is {value}, the limit is {max} \
         (a budget, not a verdict on the file: raise it with limits={{\"{limit}\": N}} \
         in zt.open, or Limits::{limit} in Rust)"
    )]
    Limit {
        /// Where.
        ctx: Context,
        /// The check it failed.
        rule: Rule,
        /// Which limit (the `Limits` field name).
        limit: &'static str,
        /// The value the file asked for.
        value: u64,
        /// The configured maximum.
        max: u64,
    },
    /// Memory for a buffer whose size comes from the file could not be
    /// allocated (the process's address-space or memory limit): an error the
    /// caller can catch, never an abort.
    #[error(
        "{ctx}: out of memory: cannot allocate {bytes} bytes for {what} \
         (the process's memory or address-space limit)"
    )]
    Memory {
        /// Where.
        ctx: Context,
        /// The buffer's purpose.
        what: &'static str,
        /// Bytes asked for.
        bytes: u64,
    },
    /// Compressed data failed to decode or decoded to the wrong length.
    #[error("{ctx}: decode failed: {reason}")]
    Decode {
        /// Where.
        ctx: Context,
        /// The check it failed.
        rule: Rule,
        /// What went wrong.
        reason: String,
    },
    /// The tensor cannot be served the way it was asked for (for example a
    /// zero-copy `map` of a compressed or unaligned tensor).
    #[error("{ctx}: unsupported: {reason}")]
    Unsupported {
        /// Where.
        ctx: Context,
        /// The check it failed.
        rule: Rule,
        /// Why.
        reason: String,
    },
    /// A tensor name that the source does not hold.
    #[error("{ctx}: no tensor named {name:?}")]
    NoSuchTensor {
        /// Where.
        ctx: Context,
        /// The name asked for.
        name: String,
    },
    /// A sharded checkpoint's index disagrees with its shards.
    #[error("{ctx}: shard index mismatch: {reason}")]
    Index {
        /// The index file.
        ctx: Context,
        /// The check it failed.
        rule: Rule,
        /// What disagrees.
        reason: String,
    },
    /// A value cannot be written in the requested format.
    #[error("{ctx}: cannot write: {reason}")]
    Write {
        /// The destination.
        ctx: Context,
        /// The check it failed.
        rule: Rule,
        /// Why.
        reason: String,
    },
    /// Stored bytes do not match the hash or digest that covers them.
    #[error("{ctx}: integrity check failed: {reason}")]
    Integrity {
        /// Where.
        ctx: Context,
        /// The check it failed.
        rule: Rule,
        /// Which check and what it found.
        reason: String,
    },
    /// Object storage refused or failed a request (the URL is the context's
    /// file). A missing object is [`Error::NotFound`] instead.
    #[error("{ctx}: {kind}: {detail}")]
    Remote {
        /// The object.
        ctx: Context,
        /// Why, as a caller acts on it.
        kind: RemoteKind,
        /// What the server or client said.
        detail: String,
    },
}

/// What is wrong with a malformed header ([`Error::Header`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reason {
    /// In words.
    Text(String),
    /// A value of one type where the format has another (boxed: every
    /// result of the crate carries an `Error`'s size).
    Mismatch(Box<Mismatch>),
}

impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Reason::Text(text) => f.write_str(text),
            Reason::Mismatch(m) => m.fmt(f),
        }
    }
}

/// A value of one type where the format has another, as data: a CBOR map
/// where the `.zt` manifest has text, an HDF5 structure of another
/// signature or type, a protobuf field of another wire type. Shown as
/// "`{what}` is `{found}`, not `{expected}`".
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mismatch {
    /// The value: "shape", "v1 B-tree node: node type", "protobuf field 7".
    pub what: String,
    /// What it is, as the message says it: "a map", "1", "length-delimited".
    pub found: String,
    /// What the format has there: "an array", "0", "a varint".
    pub expected: String,
}

impl Mismatch {
    /// `what` is `found` where the format has `expected`.
    pub fn new(
        what: impl Into<String>,
        found: impl Into<String>,
        expected: impl Into<String>,
    ) -> Mismatch {
        Mismatch {
            what: what.into(),
            found: found.into(),
            expected: expected.into(),
        }
    }
}

impl fmt::Display for Mismatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} is {}, not {}", self.what, self.found, self.expected)
    }
}

/// Why an object-storage request failed: zt-remote's own kind (built in
/// every configuration; `Unsupported` where zt was built without the
/// `remote` feature). [`Error::Remote`] never holds `NotFound` or `Memory`:
/// those are [`Error::NotFound`] and [`Error::Memory`].
pub use zt_remote::ErrorKind as RemoteKind;

/// The context field of any variant (every variant has one), as `&` or
/// `&mut` after the receiver it is given.
macro_rules! each_context {
    ($error:expr) => {
        match $error {
            Error::Io { ctx, .. }
            | Error::NotFound { ctx }
            | Error::UnknownFormat { ctx }
            | Error::Truncated { ctx, .. }
            | Error::Header { ctx, .. }
            | Error::UnsupportedDType { ctx, .. }
            | Error::Overflow { ctx, .. }
            | Error::Range { ctx, .. }
            | Error::DuplicateName { ctx }
            | Error::Limit { ctx, .. }
            | Error::Memory { ctx, .. }
            | Error::Decode { ctx, .. }
            | Error::Unsupported { ctx, .. }
            | Error::NoSuchTensor { ctx, .. }
            | Error::Index { ctx, .. }
            | Error::Write { ctx, .. }
            | Error::Integrity { ctx, .. }
            | Error::Remote { ctx, .. } => ctx,
        }
    };
}

impl Error {
    /// The context of this error.
    pub fn context(&self) -> &Context {
        each_context!(self)
    }

    fn context_mut(&mut self) -> &mut Context {
        each_context!(self)
    }

    /// What went wrong, without the context: for an error re-raised under
    /// another variant that carries its own context (a writer refusing a
    /// name the manifest rules reject), so the file and tensor are not
    /// printed twice.
    pub fn detail(&self) -> String {
        let full = self.to_string();
        let prefix = format!("{}: ", self.context());
        match full.strip_prefix(&prefix) {
            Some(rest) => rest.to_string(),
            None => full,
        }
    }

    /// Fill in the file name if the error does not name one yet. Plugins
    /// parse byte slices and need not know the path; `Source` adds it.
    pub fn in_file(mut self, path: &Path) -> Self {
        let ctx = self.context_mut();
        if ctx.file.is_none() {
            ctx.file = Some(path.to_path_buf());
        }
        self
    }

    /// Name `to` instead of `from` where the error names file `from` (an
    /// upload's spool file is reported as the URL it was written for).
    pub fn relabel(mut self, from: &Path, to: &Path) -> Self {
        let ctx = self.context_mut();
        if ctx.file.as_deref() == Some(from) {
            ctx.file = Some(to.to_path_buf());
        }
        self
    }

    /// Fill in the tensor name if the error does not name one yet.
    pub fn in_tensor(mut self, name: &str) -> Self {
        let ctx = self.context_mut();
        if ctx.tensor.is_none() {
            ctx.tensor = Some(name.to_string());
        }
        self
    }

    /// An I/O error about `path`, mapping "not found" to [`Error::NotFound`].
    pub fn io(path: &Path, source: std::io::Error) -> Self {
        if source.kind() == std::io::ErrorKind::NotFound {
            Error::NotFound {
                ctx: Context::file(path),
            }
        } else {
            Error::Io {
                ctx: Context::file(path),
                source,
            }
        }
    }

    /// The rule this error cites: the check a refused input failed. `None`
    /// for errors that are not a verdict on the input (I/O, a missing file
    /// or tensor, memory, object storage).
    pub fn rule(&self) -> Option<Rule> {
        match self {
            Error::Truncated { rule, .. }
            | Error::Header { rule, .. }
            | Error::UnsupportedDType { rule, .. }
            | Error::Overflow { rule, .. }
            | Error::Range { rule, .. }
            | Error::Limit { rule, .. }
            | Error::Decode { rule, .. }
            | Error::Unsupported { rule, .. }
            | Error::Index { rule, .. }
            | Error::Write { rule, .. }
            | Error::Integrity { rule, .. } => Some(*rule),
            Error::DuplicateName { .. } => Some(Rule::DUPLICATE_NAME),
            Error::UnknownFormat { .. } => Some(Rule::UNKNOWN_FORMAT),
            Error::Io { .. }
            | Error::NotFound { .. }
            | Error::Memory { .. }
            | Error::NoSuchTensor { .. }
            | Error::Remote { .. } => None,
        }
    }

    /// The same error citing `rule` instead (for a plugin that refines a
    /// shared check: a `.zt` manifest over its size cap is a
    /// [`Limits::check`](crate::limits::Limits::check) failure citing
    /// `zt.ManifestTooLarge`). Errors without a rule are unchanged.
    pub fn with_rule(mut self, new: Rule) -> Self {
        match &mut self {
            Error::Truncated { rule, .. }
            | Error::Header { rule, .. }
            | Error::UnsupportedDType { rule, .. }
            | Error::Overflow { rule, .. }
            | Error::Range { rule, .. }
            | Error::Limit { rule, .. }
            | Error::Decode { rule, .. }
            | Error::Unsupported { rule, .. }
            | Error::Index { rule, .. }
            | Error::Write { rule, .. }
            | Error::Integrity { rule, .. } => *rule = new,
            _ => {}
        }
        self
    }

    /// Shorthand for a malformed header ([`Error::Header`]) citing `rule`.
    pub fn header(ctx: Context, rule: Rule, reason: impl Into<String>) -> Self {
        Error::Header {
            ctx,
            rule,
            reason: Reason::Text(reason.into()),
        }
    }

    /// A malformed header ([`Error::Header`]) citing `rule` whose `what` is
    /// `found` where the format has `expected` ([`Mismatch`]).
    pub fn mismatch(
        ctx: Context,
        rule: Rule,
        what: impl Into<String>,
        found: impl Into<String>,
        expected: impl Into<String>,
    ) -> Self {
        Error::Header {
            ctx,
            rule,
            reason: Reason::Mismatch(Box::new(Mismatch::new(what, found, expected))),
        }
    }

    /// The type mismatch this error reports, if it is one.
    pub fn as_mismatch(&self) -> Option<&Mismatch> {
        match self {
            Error::Header {
                reason: Reason::Mismatch(m),
                ..
            } => Some(m),
            _ => None,
        }
    }

    /// Shorthand for a bad data range ([`Error::Range`]) citing `rule`.
    pub fn range(ctx: Context, rule: Rule, reason: impl Into<String>) -> Self {
        Error::Range {
            ctx,
            rule,
            reason: reason.into(),
        }
    }

    /// Shorthand for a decode failure ([`Error::Decode`]) citing `rule`.
    pub fn decode(ctx: Context, rule: Rule, reason: impl Into<String>) -> Self {
        Error::Decode {
            ctx,
            rule,
            reason: reason.into(),
        }
    }

    /// Shorthand for a request that cannot be served ([`Error::Unsupported`]) citing `rule`.
    pub fn unsupported(ctx: Context, rule: Rule, reason: impl Into<String>) -> Self {
        Error::Unsupported {
            ctx,
            rule,
            reason: reason.into(),
        }
    }

    /// Shorthand for a shard index mismatch ([`Error::Index`]) citing `rule`.
    pub fn index(ctx: Context, rule: Rule, reason: impl Into<String>) -> Self {
        Error::Index {
            ctx,
            rule,
            reason: reason.into(),
        }
    }

    /// Shorthand for a refused write ([`Error::Write`]) citing `rule`.
    pub fn write(ctx: Context, rule: Rule, reason: impl Into<String>) -> Self {
        Error::Write {
            ctx,
            rule,
            reason: reason.into(),
        }
    }

    /// Shorthand for a failed integrity check ([`Error::Integrity`]) citing `rule`.
    pub fn integrity(ctx: Context, rule: Rule, reason: impl Into<String>) -> Self {
        Error::Integrity {
            ctx,
            rule,
            reason: reason.into(),
        }
    }

    /// True if the input file was at fault (as opposed to the OS, the
    /// network or the caller).
    pub fn is_format_error(&self) -> bool {
        match self {
            Error::Io { .. } | Error::NotFound { .. } | Error::NoSuchTensor { .. } => false,
            Error::Remote { kind, .. } => {
                matches!(kind, RemoteKind::Changed | RemoteKind::BadResponse)
            }
            _ => true,
        }
    }
}
