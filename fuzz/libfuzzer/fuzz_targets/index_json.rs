//! libFuzzer entry for `zt_fuzz_bodies::index_json` (the body and what it checks
//! are documented there; `cargo test -p zt-fuzz-bodies` runs it over its
//! seeds on stable). `bash fuzz/run-campaign.sh index_json SECONDS`
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| zt_fuzz_bodies::index_json(data));
