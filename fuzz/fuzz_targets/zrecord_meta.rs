//! Fuzz `meta.zr`: arbitrary bytes as the header page, schema and RecordLoc
//! table. Whatever parses must check every RecordLoc without panicking.
#![no_main]

use std::path::Path;

use libfuzzer_sys::fuzz_target;
use zrecord::layout::{Header, RecordLoc, LOC, PAGE};
use zrecord::Schema;

fuzz_target!(|data: &[u8]| {
    let path = Path::new("meta.zr");
    let Ok(header) = Header::decode(data, data.len() as u64, path) else {
        return;
    };
    let _ = Schema::decode(&header.schema, true, path);
    let _ = Schema::decode(&header.schema, false, path);
    let table = &data[PAGE..];
    for (i, raw) in table
        .chunks_exact(LOC)
        .take(header.length as usize)
        .enumerate()
    {
        let loc = RecordLoc::decode(raw);
        let tail = header.tails[i % header.data_shards as usize];
        let _ = loc.check(header.codec, tail);
    }
    // A page that decodes re-encodes to the same bytes (schema padding aside).
    let page = header.encode();
    assert_eq!(
        &page[..2056 + header.schema.len()],
        &data[..2056 + header.schema.len()]
    );
});
