//! The zrecord error type: one variant per failure reason, each with the
//! store path (and where it matters the record) so a message names the
//! problem. Tests match the variant, never the text.
//!
//! [`Error::code`] maps every variant onto loaderx's numeric error codes, so
//! the Python layer can raise the same `ZrecordError(code)` loaderx raises.

use std::io;
use std::path::PathBuf;

use crate::schema::Layout;

/// Result alias used across the crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong creating, appending to or reading a store.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// No store at the path (no `meta.zr`).
    #[error("{path}: store not found")]
    NotFound {
        /// The store directory.
        path: PathBuf,
    },
    /// `create` found a store (or other files) at the destination.
    #[error("{path}: store already exists")]
    AlreadyExists {
        /// The store directory.
        path: PathBuf,
    },
    /// Another handle (in this or another process) holds a conflicting lock.
    #[error("{path}: store is busy (already open by another native handle or process)")]
    Busy {
        /// The store directory.
        path: PathBuf,
    },
    /// The operating system refused a read, write, rename or lock.
    #[error("{path}: file I/O failed: {source}")]
    Io {
        /// The file involved.
        path: PathBuf,
        /// The underlying error.
        source: io::Error,
    },
    /// `meta.zr` is shorter than its 4096-byte static page.
    #[error("{path}: invalid or unsupported zrecord store format: meta.zr is {len} bytes, shorter than the 4096-byte page")]
    ShortPage {
        /// `meta.zr`.
        path: PathBuf,
        /// Its length.
        len: u64,
    },
    /// The header's codec byte is not 0 (raw), 1 (zstd) or 2 (zstd_dict).
    #[error("{path}: invalid or unsupported zrecord store format: unknown codec tag {tag}")]
    UnknownCodec {
        /// `meta.zr`.
        path: PathBuf,
        /// The codec byte.
        tag: u8,
    },
    /// `schema_length` is outside 1..=2040.
    #[error("{path}: invalid or unsupported zrecord store format: schema length {len} is outside 1..=2040")]
    SchemaLength {
        /// `meta.zr`.
        path: PathBuf,
        /// The header's schema length.
        len: u16,
    },
    /// The header says zero data shards.
    #[error("{path}: invalid or unsupported zrecord store format: zero data shards")]
    NoShards {
        /// `meta.zr`.
        path: PathBuf,
    },
    /// A reserved header byte is not zero.
    #[error("{path}: invalid or unsupported zrecord store format: reserved header byte {index} is {value}")]
    Reserved {
        /// `meta.zr`.
        path: PathBuf,
        /// Which of the four reserved bytes.
        index: usize,
        /// Its value.
        value: u8,
    },
    /// A tail slot at or beyond the shard count is nonzero.
    #[error(
        "{path}: invalid or unsupported zrecord store format: inactive tail slot {slot} is {tail}"
    )]
    InactiveTail {
        /// `meta.zr`.
        path: PathBuf,
        /// The slot.
        slot: usize,
        /// Its value.
        tail: u64,
    },
    /// An expected `data_N.zr` is missing.
    #[error("{path}: invalid or unsupported zrecord store format: data shard {shard} is missing")]
    MissingShard {
        /// The store directory.
        path: PathBuf,
        /// The shard number.
        shard: usize,
    },
    /// A `data_*` file that the shard count does not account for.
    #[error("{path}: invalid or unsupported zrecord store format: unexpected file {name:?}")]
    UnexpectedShard {
        /// The store directory.
        path: PathBuf,
        /// The file name.
        name: String,
    },
    /// A data shard is shorter than the tail the header publishes for it.
    #[error("{path}: invalid or unsupported zrecord store format: {len} bytes, shorter than its published tail {tail}")]
    ShortShard {
        /// The shard file.
        path: PathBuf,
        /// Its length.
        len: u64,
        /// The published tail.
        tail: u64,
    },
    /// `meta.zr` is shorter than the page plus one RecordLoc per record.
    #[error("{path}: invalid or unsupported zrecord store format: meta.zr is {len} bytes, {records} records need {need}")]
    ShortLocTable {
        /// `meta.zr`.
        path: PathBuf,
        /// Its length.
        len: u64,
        /// The published record count.
        records: u64,
        /// The bytes those records need (saturated at u64::MAX).
        need: u64,
    },
    /// A `zstd_dict` store without `dict.zr`, or an empty one.
    #[error(
        "{path}: invalid or unsupported zrecord store format: zstd_dict store without a dictionary"
    )]
    MissingDict {
        /// The store directory.
        path: PathBuf,
    },
    /// A `dict.zr` zstd cannot load: it starts with the zstd dictionary
    /// magic but its header or entropy tables are corrupt or cut short.
    #[error("{path}: invalid or unsupported zrecord store format: dict.zr ({len} bytes) is not a zstd dictionary zstd can load (corrupt or truncated header or entropy tables)")]
    BadDict {
        /// The store directory.
        path: PathBuf,
        /// The length of `dict.zr`.
        len: u64,
    },
    /// A raw or zstd store with a `dict.zr`.
    #[error("{path}: invalid or unsupported zrecord store format: dict.zr in a store whose codec uses no dictionary")]
    UnexpectedDict {
        /// The store directory.
        path: PathBuf,
    },
    /// The schema bytes do not parse in the encoding their first byte
    /// announces (loaderx 2.8's JSON or loaderx 2.3's MsgPack).
    #[error("{path}: invalid schema: not a {layout} schema: {reason}")]
    SchemaSyntax {
        /// `meta.zr`.
        path: PathBuf,
        /// The layout the schema's first byte announces.
        layout: Layout,
        /// Where parsing failed.
        reason: &'static str,
    },
    /// The schema's fields are not exactly those of the geometry the caller
    /// opens (a Dense store opened as Ragged, or a foreign field).
    #[error("{path}: invalid {geometry} schema fields, expected {expected:?}, found {found:?} ({layout})")]
    SchemaFields {
        /// `meta.zr`.
        path: PathBuf,
        /// The schema's layout.
        layout: Layout,
        /// `"dense"` or `"ragged"`: what the caller expected.
        geometry: &'static str,
        /// The fields that geometry has in that layout.
        expected: &'static [&'static str],
        /// The fields the schema has.
        found: Vec<String>,
    },
    /// A dtype the chosen layout cannot hold: loaderx 2.8 stores hold only
    /// its twenty native-order types (`zrecord::schema::LOADERX28_DTYPES`).
    #[error("dtype {dtype:?} cannot be stored in a {layout} store (loaderx 2.8 holds bool, (u)int8..64, float16/32/64, bfloat16, the float8 types and complex64/128, native byte order); create the store with the loaderx-2.3 layout to keep it")]
    DtypeNotInLayout {
        /// The dtype asked for.
        dtype: String,
        /// The layout.
        layout: Layout,
    },
    /// A schema field holds a value its geometry cannot have (a dtype that
    /// is not a string or not a type, a rank out of range, a shape too large).
    #[error("{path}: invalid schema: {reason}")]
    Schema {
        /// `meta.zr` (empty when validating a schema on its own).
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// A RecordLoc is inconsistent (lengths, codec or shard frontier).
    #[error("{path}: invalid or unsupported zrecord store format: record {index}: {reason}")]
    BadLoc {
        /// The store directory.
        path: PathBuf,
        /// The record.
        index: u64,
        /// What is wrong.
        reason: &'static str,
    },
    /// A stored record failed to decode (zstd error, wrong length, bad shape).
    #[error("{path}: stored record failed to decode: record {index}: {reason}")]
    Decode {
        /// The store directory.
        path: PathBuf,
        /// The record.
        index: u64,
        /// What is wrong.
        reason: String,
    },
    /// A record index at or beyond the store length.
    #[error("record index {index} out of range for container of length {len}")]
    OutOfRange {
        /// The index asked for.
        index: u64,
        /// The store length.
        len: u64,
    },
    /// A record is empty or larger than the 2^31-byte record limit.
    #[error("record {index} has {len} bytes; records must hold 1..=2147483648 bytes")]
    RecordSize {
        /// Position in the batch.
        index: usize,
        /// Its encoded length.
        len: u64,
    },
    /// A buffer sized from the store (a Ragged gather's payload) could not
    /// be allocated: an error the caller can catch, never an abort.
    #[error("{path}: out of memory: cannot allocate {bytes} bytes for {what}")]
    Memory {
        /// The store directory.
        path: PathBuf,
        /// The buffer's purpose.
        what: &'static str,
        /// Bytes asked for.
        bytes: u64,
    },
    /// A dataset manifest, or a store it lists, refused: `rule` is one of
    /// [`crate::dataset::rules`].
    #[error("{path}: {reason} (rule {rule})")]
    Dataset {
        /// The manifest (or the first store of a list).
        path: PathBuf,
        /// The rule the refusal cites.
        rule: &'static str,
        /// What is wrong.
        reason: String,
    },
    /// A caller's argument is inconsistent (buffer sizes, shapes, counts).
    #[error("invalid argument: {reason}")]
    Invalid {
        /// What is wrong.
        reason: String,
    },
    /// The record count or a shard would pass what the layout can address.
    #[error("{path}: store is full")]
    Full {
        /// The store directory.
        path: PathBuf,
    },
    /// zstd failed to compress or to train a dictionary.
    #[error("zstd: {reason}")]
    Zstd {
        /// zstd's error text.
        reason: String,
    },
    /// Dictionary training failed (too few or too small samples).
    #[error("zstd dictionary training failed (too few or too small samples): {reason}")]
    DictTraining {
        /// zstd's error text.
        reason: String,
    },
    /// Object storage refused or failed a request for a store at an
    /// `s3://` or `https://` location.
    #[error("{path}: {kind}: {detail}")]
    Remote {
        /// The store (or object) URL.
        path: PathBuf,
        /// Why.
        kind: RemoteKind,
        /// What the server or client said.
        detail: String,
    },
}

/// Why an object-storage request failed: zt-remote's own kind, the one
/// zt-core reports too (built in every configuration; `Unsupported` where
/// zrecord was built without the `remote` feature). [`Error::Remote`] never
/// holds `NotFound` or `Memory`: those are [`Error::NotFound`] and
/// [`Error::Memory`].
pub use zt_remote::ErrorKind as RemoteKind;

impl Error {
    /// loaderx's numeric code for this error (`loaderx/_store.py` `_ERRORS`).
    pub fn code(&self) -> i32 {
        match self {
            Error::Io { .. } => -2,
            Error::Remote {
                kind: RemoteKind::Io,
                ..
            } => -2,
            Error::RecordSize { .. } => -4,
            Error::Full { .. } => -5,
            Error::Decode { .. } | Error::Zstd { .. } => -7,
            Error::DictTraining { .. } => -9,
            Error::NotFound { .. } => -11,
            Error::AlreadyExists { .. } => -12,
            Error::Busy { .. } => -13,
            Error::Invalid { .. } | Error::OutOfRange { .. } => -6,
            _ => -8,
        }
    }

    /// True for the "invalid or unsupported zrecord store format" family.
    pub fn is_format(&self) -> bool {
        self.code() == -8
    }

    pub(crate) fn io(path: impl Into<PathBuf>, source: io::Error) -> Self {
        Error::Io {
            path: path.into(),
            source,
        }
    }

    pub(crate) fn invalid(reason: impl Into<String>) -> Self {
        Error::Invalid {
            reason: reason.into(),
        }
    }
}
