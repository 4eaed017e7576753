//! Writing `.zt` files.
//!
//! Two paths produce identical bytes for identical input:
//!
//! * [`Writer`], incremental: `add`, `add_object`, `stream` (chunked, for
//!   tensors larger than memory), `set_attributes`, `ingest`, `finish`,
//!   `abandon`. Blobs go to the file as they arrive.
//! * [`write_objects`], the batch path behind `convert` and
//!   `zt.numpy.save_file`: every tensor is in memory (or mapped) at once, so
//!   each raw part is hashed on the writing thread just before it is
//!   written (`scout`), runs of small parts a little ahead on a helper
//!   thread (`prehash`); with compression, hashing and compression run on
//!   the pool (`ahead`); the file is written front to back in one pass, and
//!   duplicates are confirmed against the bytes in memory.
//!
//! Placement: canonical (64 KiB from 65536, the §6.3 rules, byte-identical
//! to upstream ztensor 2.1.2), a fixed power of two ≥ 4096, or `auto`:
//! blobs of at least [`AUTO_THRESHOLD`] bytes at 64 KiB (their pages are
//! their own at every page size, so per-tensor evict keeps working), smaller
//! ones at the 4 KiB floor (a 10 KiB tensor then costs 12 KiB, not 64 KiB).
//!
//! Byte-identical decoded parts always share one blob (the dedup key is the
//! XXH3-64 digest the manifest stores anyway, plus the length; the batch
//! writer's scout first rules out parts over 256 KiB whose length and first
//! 4 KiB match no earlier part; equality is confirmed on the bytes before
//! sharing).
//!
//! | module | job |
//! |---|---|
//! | `options` | [`Options`]: placement ([`Align`]), canonical form, publish, append, compression; [`ZtOptions`], the `.zt` options a request carries |
//! | `input` | [`ObjectIn`]/[`PartIn`] (what writers take), their checks, a source's objects |
//! | `heap` | blob placement and the shared-blob table, one for both paths |
//! | `describe` | the manifest a writer emits: part and object CBOR, the footer |
//! | `batch` | [`write_objects`] and [`convert`] (and, for a shard, [`write_shard`] and [`convert_shard`]: also the whole-file digest, kept while writing, and the manifest) |
//! | `stream` | [`Writer`], the incremental and streaming writer |

mod batch;
mod convert;
mod describe;
mod heap;
mod input;
mod options;
mod stream;

pub use batch::{write_objects, write_shard};
pub use convert::{convert, convert_shard};
pub(crate) use input::objects_to_ingest;
pub use input::{attributes_cbor, objects_of, ObjectIn, PartIn};
pub use options::{
    Align, Options, ZtOptions, AUTO_THRESHOLD, DEFAULT_LEVEL, OPTION_ALIGN, OPTION_COMPRESSION,
};
pub use stream::{Prepared, Writer};
