//! The one libFuzzer binary: it runs the fuzz target named by
//! `ZT_FUZZ_TARGET` (`zt_fuzz_bodies::targets()`: the registry's plugin
//! targets and the bodies written in `fuzz/bodies`; each body and what it
//! checks are documented there, and `cargo test -p zt-fuzz-bodies` runs it
//! over its seeds on stable).
//!
//!     ZT_FUZZ_TARGET=gguf cargo +nightly fuzz run --fuzz-dir fuzz/libfuzzer body ...
//!     bash fuzz/run-campaign.sh gguf SECONDS    # the same, with seeds and limits
#![no_main]

use std::sync::OnceLock;

use zt_fuzz_bodies::Target;

static TARGET: OnceLock<&'static Target> = OnceLock::new();

libfuzzer_sys::fuzz_target!(
    init: {
        let name = std::env::var("ZT_FUZZ_TARGET").unwrap_or_default();
        let target = zt_fuzz_bodies::target(&name).unwrap_or_else(|| {
            let names: Vec<&str> = zt_fuzz_bodies::targets().iter().map(|t| t.name).collect();
            panic!("ZT_FUZZ_TARGET={name:?} names no fuzz target; one of {names:?}")
        });
        let _ = TARGET.set(target);
    },
    |data: &[u8]| TARGET.get().expect("set at initialization").run(data)
);
