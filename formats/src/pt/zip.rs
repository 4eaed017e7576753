//! The zip checkpoint of torch ≥ 1.6: `<root>/data.pkl`, `<root>/byteorder`,
//! `<root>/version` and one `<root>/data/<key>` record per storage. The root
//! folder is whatever the first record's folder is (torch names it after
//! the file), as `PyTorchStreamReader` derives it.

use crate::pt::rules;
use crate::zip::rules as zip_rules;
use std::collections::HashMap;

use super::pickle::Vm;
use super::rebuild::{find_tensors, TorchInterp};
use super::{catalog, root_name, Record};
use crate::zip::{member_bytes, read_entries_in, Entry};
use std::sync::Arc;
use zt_core::catalog::{Catalog, Value};
use zt_core::error::{Error, Result};
use zt_core::format::OpenInput;
use zt_core::limits::Limits;
use zt_core::store::Store;

/// Read the archive's pickle and resolve every tensor to its record.
pub fn open(input: &OpenInput<'_>) -> Result<Catalog> {
    open_in(input.store, input.limits, 0, input.store.len())
}

/// [`open`] for an archive embedded at `[start, start + len)` of `store`
/// (each chunk of a PyTorch distributed checkpoint is a whole `torch.save`
/// archive inside a `.distcp` file): the catalog's payloads point into
/// `store`.
pub fn open_in(store: &Arc<Store>, limits: &Limits, start: u64, len: u64) -> Result<Catalog> {
    let ctx = store.ctx();
    let entries = read_entries_in(store, &ctx, limits, start, len)?;
    let root = match entries.first().and_then(|e| e.name.split_once('/')) {
        Some((root, _)) => root.to_string(),
        None => {
            return Err(Error::header(
                ctx,
                rules::ARCHIVE,
                "the first record of the archive is not in a folder",
            ))
        }
    };
    let by_name: HashMap<&str, &Entry> = entries.iter().map(|e| (e.name.as_str(), e)).collect();
    let record = |name: &str| by_name.get(format!("{root}/{name}").as_str()).copied();

    if let Some(order) = record("byteorder") {
        let text = member_bytes(store, &ctx, order, limits, ("header_bytes", 64))?;
        match text.as_ref() {
            b"little" => {}
            b"big" => {
                return Err(Error::Unsupported {
                    rule: rules::UNSUPPORTED,
                    ctx,
                    reason: "big-endian checkpoint (byteorder record says \"big\")".into(),
                })
            }
            other => {
                return Err(Error::header(
                    ctx,
                    rules::ARCHIVE,
                    format!(
                        "byteorder record holds {:?}",
                        String::from_utf8_lossy(other)
                    ),
                ))
            }
        }
    }
    let pkl = record("data.pkl").ok_or_else(|| {
        Error::header(
            ctx.clone(),
            rules::ARCHIVE,
            format!("no {root}/data.pkl record"),
        )
    })?;
    let bytes = member_bytes(
        store,
        &ctx,
        pkl,
        limits,
        ("pickle_bytes", limits.pickle_bytes),
    )?;
    if pkl.method == 0 && crc32fast::hash(&bytes) != pkl.crc {
        return Err(Error::Decode {
            rule: zip_rules::ENTRY,
            ctx,
            reason: format!("{root}/data.pkl does not match its CRC-32"),
        });
    }
    let mut vm = Vm::new(ctx.clone(), limits);
    let mut interp = TorchInterp::default();
    let (object, _) = vm.run(&bytes, 0, &mut interp)?;
    let found = find_tensors(&vm, object, &root_name(store))?;

    let attributes = vec![
        ("pt.format".to_string(), Value::Str("zip".into())),
        (
            "pt.globals".to_string(),
            Value::List(interp.globals.into_iter().map(Value::Str).collect()),
        ),
    ];
    catalog(store, found, attributes, |key| {
        let name = format!("data/{key}");
        let entry = record(&name).ok_or_else(|| {
            Error::header(
                ctx.clone(),
                rules::ARCHIVE,
                format!("no {root}/{name} record for storage {key:?}"),
            )
        })?;
        if entry.encrypted() {
            return Err(Error::Unsupported {
                rule: zip_rules::UNSUPPORTED,
                ctx: ctx.clone(),
                reason: format!("record {:?} is encrypted", entry.name),
            });
        }
        match entry.method {
            0 if entry.compressed == entry.uncompressed => Ok(Record::Stored {
                offset: entry.data_start,
                len: entry.uncompressed,
            }),
            0 => Err(Error::header(
                ctx.clone(),
                zip_rules::ENTRY,
                format!(
                    "stored record {:?} declares {} compressed and {} uncompressed bytes",
                    entry.name, entry.compressed, entry.uncompressed
                ),
            )),
            8 => {
                limits.check_decoded(&ctx, entry.uncompressed)?;
                Ok(Record::Deflated((*entry).clone()))
            }
            m => Err(Error::Unsupported {
                rule: zip_rules::UNSUPPORTED,
                ctx: ctx.clone(),
                reason: format!(
                    "record {:?} uses zip compression method {m}; only stored (0) and deflate (8) are read",
                    entry.name
                ),
            }),
        }
    })
}
