//! Write the seeds of the targets whose seeds are built in Rust
//! (`zt_fuzz_bodies::generate::generated()`: `zrecord_dict`, `index_json`,
//! `http_response`, `dcp`, and every plugin target that makes its own,
//! `zt::FuzzTarget::make_seeds`), replacing the seed files in their directories:
//! `cargo run -p zt-fuzz-bodies --example make-seeds`. `cargo test` checks
//! that the committed seeds are what this writes.

use zt_fuzz_bodies::generate::{generated, seed_dir, seeds, write};

fn main() {
    for target in generated() {
        let dir = seed_dir(target);
        write(target, &dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
        let seeds = seeds(target);
        let bytes: usize = seeds.iter().map(|(_, b)| b.len()).sum();
        println!("{target}: {} files, {bytes} bytes", seeds.len());
    }
}
