//! Keras 3's `.keras` file: a zip of `metadata.json`, `config.json` and
//! `model.weights.h5` (keras 3.15.1 `saving_lib`). The weights are the
//! HDF5 reader's, walked in place in the stored member (its superblock
//! at the member's first byte, every address relative to it), so they
//! map zero-copy like a `.weights.h5`; a deflated member is inflated
//! (bounded by `decoded_bytes`) and walked in memory. The two JSON
//! members become the file attributes `config.json` and `metadata.json`.

use std::collections::HashMap;
use std::sync::Arc;

use zt_core::catalog::{Catalog, Value};
use zt_core::error::{Error, Result};
use zt_core::format::{Format, OpenInput, Probe};
use zt_core::store::Store;

use super::rules::KERAS_ARCHIVE;
use super::superblock;

/// The `.keras` reader.
pub struct KerasArchive;

/// The member holding the weights.
const WEIGHTS: &str = "model.weights.h5";
/// The members read as attributes.
const JSON_MEMBERS: [&str; 2] = ["config.json", "metadata.json"];

impl Format for KerasArchive {
    fn name(&self) -> &'static str {
        "keras"
    }

    fn extensions(&self) -> &'static [&'static str] {
        &["keras"]
    }

    /// A zip named `.keras` (Keras loads no other name as one).
    fn sniff(&self, probe: &Probe<'_>) -> bool {
        probe.extension == "keras" && probe.head.starts_with(b"PK\x03\x04")
    }

    fn fuzz(&self) -> Option<zt_core::FuzzTarget> {
        Some(zt_core::FuzzTarget::new("keras", &["fuzz/seeds/keras"]))
    }

    fn open(&self, input: &OpenInput<'_>) -> Result<Catalog> {
        let ctx = input.ctx();
        let mut members = HashMap::new();
        for entry in crate::zip::read_entries(input.store, &ctx, input.limits)? {
            let at = entry.local_offset;
            if let Some(old) = members.insert(entry.name.clone(), entry) {
                return Err(Error::header(
                    ctx.at(at),
                    KERAS_ARCHIVE,
                    format!("member {:?} appears twice", old.name),
                ));
            }
        }
        let weights = members.get(WEIGHTS).ok_or_else(|| {
            Error::header(
                ctx.clone(),
                KERAS_ARCHIVE,
                format!(
                    "no {WEIGHTS} member (a .keras zip holds config.json, metadata.json and \
                     {WEIGHTS}; sharded weights inside one are not read)"
                ),
            )
        })?;
        let mut catalog = if weights.method == 0 && weights.compressed == weights.uncompressed {
            input
                .store
                .check_range(weights.data_start, weights.compressed, WEIGHTS)?;
            let sb = superblock::parse_at(input.store, weights.data_start)?;
            super::open_at(input.store, input.limits, sb)
        } else {
            let bytes = crate::zip::member_bytes(
                input.store,
                &ctx,
                weights,
                input.limits,
                ("decoded_bytes", input.limits.decoded_bytes),
            )?
            .into_owned();
            let store = Arc::new(Store::from_bytes(input.store.path(), bytes));
            let sb = superblock::read(&store)?;
            super::open_at(&store, input.limits, sb)
        }
        .map_err(|e| e.in_file(input.store.path()))?;
        for name in JSON_MEMBERS {
            let Some(entry) = members.get(name) else {
                continue;
            };
            let text = crate::zip::member_bytes(
                input.store,
                &ctx,
                entry,
                input.limits,
                ("header_bytes", input.limits.header_bytes),
            )?;
            let json: serde_json::Value = serde_json::from_slice(&text).map_err(|e| {
                Error::header(
                    ctx.clone().at(entry.local_offset),
                    KERAS_ARCHIVE,
                    format!("{name} is not JSON: {e}"),
                )
            })?;
            catalog
                .attributes
                .push((name.to_string(), Value::from_json(&json)));
        }
        Ok(catalog)
    }
}
