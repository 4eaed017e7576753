//! Run any bytes through the PyTorch pickle machine and the tensor search:
//! errors are fine; panics, aborts, runaway allocation and stack overflow
//! are not. (`open_any` reaches the machine only through a valid zip or the
//! legacy magic; this target feeds it directly.)
//!
//! `cargo +nightly fuzz run pickle`

#![no_main]

use libfuzzer_sys::fuzz_target;
use zt::formats::pt::pickle::Vm;
use zt::formats::pt::rebuild::{find_tensors, TorchInterp};
use zt::{Context, Limits};

fuzz_target!(|data: &[u8]| {
    // Small budgets keep each input fast; the checks are the same.
    let limits = Limits {
        pickle_ops: 1 << 16,
        pickle_objects: 1 << 14,
        ..Limits::default()
    };
    for legacy in [false, true] {
        let mut vm = Vm::new(Context::default(), &limits);
        let mut interp = TorchInterp {
            legacy,
            ..TorchInterp::default()
        };
        if let Ok((root, _)) = vm.run(data, 0, &mut interp) {
            let _ = find_tensors(&vm, root, "root");
        }
    }
});
