//! libFuzzer entry for `zt_fuzz_bodies::zrecord_dict` (the body and what it checks
//! are documented there; `cargo test -p zt-fuzz-bodies` runs it over its
//! seeds on stable). `bash fuzz/run-campaign.sh zrecord_dict SECONDS`
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| zt_fuzz_bodies::zrecord_dict(data));
