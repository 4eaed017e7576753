//! The named rules a refusal cites: what check a file (or a write request)
//! failed, as data a caller and a test can match without reading message
//! text.
//!
//! Every error that refuses an input ([`crate::Error::Header`], `Range`,
//! `Decode`, `Unsupported`, `Index`, `Write`, `Integrity`, and the
//! structured `Truncated`, `Overflow`, `Limit`, `UnsupportedDType`) carries
//! one; [`crate::Error::rule`] reads it. The variant stays the category (it
//! decides the message's prefix and whether the input is at fault); the
//! rule says which check, once per distinct reason, not once per call site.
//!
//! A [`Rule`] is an open value: any crate mints one with [`Rule::new`], so
//! the core names no plugin's checks. A rule's [`Rule::name`] is
//! `"<plugin>.<Check>"` and stable. The core defines only the rules every
//! plugin shares, as associated constants here: `core.`, `index.`,
//! `access.` and `write.`. Each plugin declares its own beside its code
//! (`zt_container::rules` holds the `.zt` container's, upstream ztensor's
//! `Rule` names under `zt.`; `zt_formats::safetensors::rules` holds
//! `safetensors.Offsets`, and so on), with a `RULES` list of them all that
//! the registry's tests check for unique, prefixed names.

use std::fmt;

/// A named check an input failed (see the module documentation). Two rules
/// are equal when their names are.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Rule {
    name: &'static str,
}

impl Rule {
    /// The rule named `name`, `"<plugin>.<Check>"` (a plugin's constant;
    /// the name is what tests, sidecars and Python's `FormatError.rule`
    /// see, so it never changes once published).
    pub const fn new(name: &'static str) -> Rule {
        Rule { name }
    }

    /// The rule's stable name, `"<plugin>.<Check>"`.
    pub const fn name(self) -> &'static str {
        self.name
    }

    /// The plugin (or shared group) the rule belongs to: the name up to its
    /// dot (`"zt"`, `"safetensors"`, `"core"`).
    pub fn plugin(self) -> &'static str {
        let name = self.name;
        &name[..name.find('.').unwrap_or(name.len())]
    }
}

/// The rules the core itself cites, shared by every plugin.
impl Rule {
    // --- Shared by every plugin: the structured variants' own rules. ---
    /// The file ends before a structure it declares.
    pub const TRUNCATED: Rule = Rule::new("core.Truncated");
    /// Arithmetic on declared sizes overflowed.
    pub const OVERFLOW: Rule = Rule::new("core.Overflow");
    /// A configured limit would be exceeded.
    pub const LIMIT: Rule = Rule::new("core.Limit");
    /// A dtype the format or zt does not know.
    pub const DTYPE: Rule = Rule::new("core.DType");
    /// Two tensors share a name.
    pub const DUPLICATE_NAME: Rule = Rule::new("core.DuplicateName");
    /// No registered format recognises the file.
    pub const UNKNOWN_FORMAT: Rule = Rule::new("core.UnknownFormat");
    /// Compressed or encoded data decoded to the wrong length.
    pub const DECODED_LENGTH: Rule = Rule::new("core.DecodedLength");
    /// A byte range asked of a tensor lies outside it.
    pub const READ_RANGE: Rule = Rule::new("core.ReadRange");
    /// A logical type's data breaks its rule (a bool element that is not 0
    /// or 1, an odd fp4 tensor's trailing nibble that is not 0), in a
    /// format with no rule of its own for it (`.zt` cites `zt.LayoutData`).
    pub const LOGICAL_DATA: Rule = Rule::new("core.LogicalData");
    /// A part's payload disagrees with its shape, dtype or strides.
    pub const PART_SIZE: Rule = Rule::new("core.PartSize");
    /// A related-file location (a shard, external data) that is not a
    /// plain relative path inside the file's directory.
    pub const LOCATION: Rule = Rule::new("core.Location");
    /// A plugin's listing order that is not a permutation of its objects
    /// (`Catalog::order`).
    pub const LISTING_ORDER: Rule = Rule::new("core.ListingOrder");

    // --- Sharded checkpoints (`*.index.json`, model directories). ---
    /// The index is not JSON of the documented shape.
    pub const INDEX_SCHEMA: Rule = Rule::new("index.Schema");
    /// A shard path leaves the index's directory or is itself an index.
    pub const INDEX_SHARD_PATH: Rule = Rule::new("index.ShardPath");
    /// The index and its shards disagree (a tensor's shard, a shard's size).
    pub const INDEX_MISMATCH: Rule = Rule::new("index.Mismatch");
    /// A directory holds no checkpoint, or several, to choose from.
    pub const INDEX_CHECKPOINT: Rule = Rule::new("index.Checkpoint");

    // --- Serving a tensor the way it was asked for. ---
    /// A zero-copy map of bytes the file does not hold as-is (encoded,
    /// unaligned, or a store that is not memory-mapped).
    pub const ACCESS_MAP: Rule = Rule::new("access.Map");
    /// A strided or typed view the part's dtype or order cannot give.
    pub const ACCESS_VIEW: Rule = Rule::new("access.View");
    /// A page operation on a range that is not page-aligned.
    pub const ACCESS_PAGES: Rule = Rule::new("access.Pages");
    /// A selection (slice) that does not fit the tensor.
    pub const ACCESS_SELECTION: Rule = Rule::new("access.Selection");
    /// A tensor of several parts asked for as one array.
    pub const ACCESS_PART: Rule = Rule::new("access.Part");
    /// Nothing to open (an empty list of files).
    pub const ACCESS_INPUT: Rule = Rule::new("access.Input");
    /// Memory handed in to be filled (`load_into`) that is not exactly the
    /// size of the tensor's elements.
    pub const ACCESS_DESTINATION: Rule = Rule::new("access.Destination");

    // --- Writing. ---
    /// The destination path cannot take the output.
    pub const WRITE_DESTINATION: Rule = Rule::new("write.Destination");
    /// Options that do not combine, or that the format lacks.
    pub const WRITE_OPTIONS: Rule = Rule::new("write.Options");
    /// Metadata the format cannot carry.
    pub const WRITE_METADATA: Rule = Rule::new("write.Metadata");
    /// A dtype or layout the format cannot store.
    pub const WRITE_DTYPE: Rule = Rule::new("write.DType");
    /// A tensor or member name the format refuses.
    pub const WRITE_NAME: Rule = Rule::new("write.Name");
    /// A tensor the format cannot describe (no parts, wrong count).
    pub const WRITE_OBJECT: Rule = Rule::new("write.Object");
    /// A writer used out of order (finished, or a stream still open).
    pub const WRITE_STATE: Rule = Rule::new("write.State");
    /// A command line that does not say what to write.
    pub const WRITE_USAGE: Rule = Rule::new("write.Usage");
    /// No writer for the format or extension asked for.
    pub const WRITE_FORMAT: Rule = Rule::new("write.Format");
    /// A tensor's bytes are not its shape times its dtype's width.
    pub const WRITE_SIZE: Rule = Rule::new("write.Size");
    /// A conversion's `select` pattern that is malformed or matches no tensor.
    pub const WRITE_SELECT: Rule = Rule::new("write.Select");
    /// A conversion's `rename` that gives two tensors one name, or a
    /// tensor an empty name.
    pub const WRITE_RENAME: Rule = Rule::new("write.Rename");
    /// A conversion's `dtype` that is not a floating type zt casts to, or a
    /// tensor whose floating type zt cannot cast from.
    pub const WRITE_CAST: Rule = Rule::new("write.Cast");

    /// Every rule the core defines (the registry's tests add each plugin's
    /// `RULES` and check that no name repeats).
    pub const CORE: &'static [Rule] = &[
        Rule::TRUNCATED,
        Rule::OVERFLOW,
        Rule::LIMIT,
        Rule::DTYPE,
        Rule::DUPLICATE_NAME,
        Rule::UNKNOWN_FORMAT,
        Rule::DECODED_LENGTH,
        Rule::READ_RANGE,
        Rule::LOGICAL_DATA,
        Rule::PART_SIZE,
        Rule::LOCATION,
        Rule::LISTING_ORDER,
        Rule::INDEX_SCHEMA,
        Rule::INDEX_SHARD_PATH,
        Rule::INDEX_MISMATCH,
        Rule::INDEX_CHECKPOINT,
        Rule::ACCESS_MAP,
        Rule::ACCESS_VIEW,
        Rule::ACCESS_PAGES,
        Rule::ACCESS_SELECTION,
        Rule::ACCESS_PART,
        Rule::ACCESS_INPUT,
        Rule::ACCESS_DESTINATION,
        Rule::WRITE_DESTINATION,
        Rule::WRITE_OPTIONS,
        Rule::WRITE_METADATA,
        Rule::WRITE_DTYPE,
        Rule::WRITE_NAME,
        Rule::WRITE_OBJECT,
        Rule::WRITE_STATE,
        Rule::WRITE_USAGE,
        Rule::WRITE_FORMAT,
        Rule::WRITE_SIZE,
        Rule::WRITE_SELECT,
        Rule::WRITE_RENAME,
        Rule::WRITE_CAST,
    ];
}

impl fmt::Display for Rule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name)
    }
}

#[cfg(test)]
mod tests {
    use super::Rule;

    #[test]
    fn core_rules_are_in_core_groups_and_print_their_names() {
        for &r in Rule::CORE {
            assert!(
                ["core", "index", "access", "write"].contains(&r.plugin()),
                "{r} is not a core rule"
            );
            assert_eq!(r.to_string(), r.name());
        }
        assert_eq!(Rule::new("zt.BlobOverlap").plugin(), "zt");
        assert_eq!(Rule::new("zt.BlobOverlap"), Rule::new("zt.BlobOverlap"));
        assert_ne!(Rule::TRUNCATED, Rule::new("zt.BlobOverlap"));
    }
}
