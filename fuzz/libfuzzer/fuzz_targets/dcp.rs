//! libFuzzer entry for `zt_fuzz_bodies::dcp` (the body and what it checks
//! are documented there; `cargo test -p zt-fuzz-bodies` runs it over its
//! seeds on stable). `bash fuzz/run-campaign.sh dcp SECONDS`
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| zt_fuzz_bodies::dcp(data));
