//! The legacy checkpoint (torch 0.4-1.5, or `_use_new_zipfile_serialization=False`):
//! five pickles (the magic number, the protocol version 1001, a `sys_info`
//! dict, the object, the sorted list of storage keys), then for each key
//! an i64 little-endian element count and the storage's raw bytes.
//!
//! The pickles must lie within the first `Limits::pickle_bytes` of the file.

use crate::pt::rules;
use std::collections::HashMap;
use zt_core::Rule;

use super::pickle::{Node, Vm};
use super::rebuild::{find_tensors, Torch, TorchInterp};
use super::{catalog, root_name, Record};
use zt_core::catalog::{Catalog, Value};
use zt_core::error::{Error, Result};
use zt_core::format::OpenInput;
use zt_core::limits::Limits;

/// 0x1950a86a20f9469cfc6c, little-endian, as `LONG1` carries it.
const MAGIC: [u8; 10] = [0x6c, 0xfc, 0x9c, 0x46, 0xf9, 0x20, 0x6a, 0xa8, 0x50, 0x19];
/// `torch.serialization.PROTOCOL_VERSION`.
const PROTOCOL_VERSION: i64 = 1001;

/// Read the pickles, then walk the storages that follow them.
pub fn open(input: &OpenInput<'_>) -> Result<Catalog> {
    let store = input.store;
    let limits = input.limits;
    let ctx = input.ctx();
    let data = store.read_upto(0, limits.pickle_bytes)?;
    let mut vm = Vm::new(ctx.clone(), limits);
    let mut interp = TorchInterp {
        legacy: true,
        ..TorchInterp::default()
    };
    let (magic, pos) = vm.run(&data, 0, &mut interp)?;
    if !matches!(vm.get(magic), Node::BigInt(b) if **b == MAGIC) {
        return Err(Error::header(
            ctx,
            rules::LEGACY,
            "legacy checkpoint without torch's magic number",
        ));
    }
    let (version, pos) = vm.run(&data, pos, &mut interp)?;
    if vm.int(version) != Some(PROTOCOL_VERSION) {
        return Err(Error::header(
            ctx,
            rules::LEGACY,
            format!("legacy protocol version is not {PROTOCOL_VERSION}"),
        ));
    }
    let (sys_info, pos) = vm.run(&data, pos, &mut interp)?;
    if let Node::Dict(items) = vm.get(sys_info) {
        let big = items.iter().any(|&(k, v)| {
            vm.str(k) == Some("little_endian") && matches!(vm.get(v), Node::Bool(false))
        });
        if big {
            return Err(Error::Unsupported {
                rule: rules::UNSUPPORTED,
                ctx,
                reason: "big-endian legacy checkpoint".into(),
            });
        }
    }
    let (object, pos) = vm.run(&data, pos, &mut interp)?;
    let (keys, pos) = vm.run(&data, pos, &mut interp)?;
    let keys: Vec<String> = vm
        .items(keys)
        .ok_or_else(|| {
            Error::header(
                ctx.clone(),
                rules::LEGACY,
                "the storage key list is not a list",
            )
        })?
        .iter()
        .map(|&k| vm.str(k).map(str::to_string))
        .collect::<Option<_>>()
        .ok_or_else(|| {
            Error::header(ctx.clone(), rules::LEGACY, "a storage key is not a string")
        })?;
    limits.check_tensors(&ctx, keys.len() as u64)?;

    // Every storage the pickle declared, first declaration winning as in
    // torch's `deserialized_objects`.
    let found = find_tensors(&vm, object, &root_name(store))?;
    let mut declared = HashMap::new();
    for i in 0..vm.len() as u32 {
        if let Node::Torch(t) = vm.get(i) {
            if let Torch::Storage(s) = t.as_ref() {
                declared.entry(s.key.clone()).or_insert((s.kind, s.numel));
            }
        }
    }

    // The storages follow the pickles in key-list order.
    let mut records: HashMap<String, Record> = HashMap::with_capacity(keys.len());
    let mut at = pos as u64;
    for key in keys {
        let &(kind, numel) = declared.get(key.as_str()).ok_or_else(|| {
            Error::header(
                ctx.clone(),
                rules::LEGACY,
                format!("storage {key:?} is listed but the pickle never declares it"),
            )
        })?;
        store.check_range(at, 8, "legacy storage size")?;
        let count = i64::from_le_bytes(store.read(at, 8)?.as_ref().try_into().expect("8 bytes"));
        if u64::try_from(count).ok() != Some(numel) {
            return Err(Error::range(
                ctx.clone().at(at),
                rules::STORAGE,
                format!("storage {key:?} declares {numel} elements, the file {count}"),
            ));
        }
        let len = numel
            .checked_mul(kind.element_size())
            .ok_or_else(|| Error::Overflow {
                rule: Rule::OVERFLOW,
                ctx: ctx.clone(),
                what: "storage size",
            })?;
        store.check_range(at + 8, len, "legacy storage")?;
        Limits::check(&ctx, "entries", records.len() as u64 + 1, limits.entries)?;
        if records
            .insert(
                key.clone(),
                Record::Stored {
                    offset: at + 8,
                    len,
                },
            )
            .is_some()
        {
            return Err(Error::header(
                ctx.clone(),
                rules::LEGACY,
                format!("storage {key:?} is listed twice"),
            ));
        }
        at = at + 8 + len;
    }

    let attributes = vec![
        ("pt.format".to_string(), Value::Str("legacy".into())),
        (
            "pt.globals".to_string(),
            Value::List(interp.globals.into_iter().map(Value::Str).collect()),
        ),
    ];
    catalog(store, found, attributes, |key| {
        records.get(key).cloned().ok_or_else(|| {
            Error::header(
                ctx.clone(),
                rules::LEGACY,
                format!("no storage data for key {key:?}"),
            )
        })
    })
}
