//! Print the seed directories of one fuzz target, one a line (absolute),
//! for fuzz/run-campaign.sh: `cargo run -q -p zt-fuzz-bodies --example seed-dirs -- TARGET`.

fn main() {
    let target = std::env::args().nth(1).expect("usage: seed-dirs TARGET");
    let root = zt_fuzz_bodies::repo_root();
    let (_, dirs) = zt_fuzz_bodies::SEEDS
        .iter()
        .find(|(n, _)| *n == target)
        .unwrap_or_else(|| panic!("no fuzz target {target}"));
    for dir in *dirs {
        println!("{}", root.join(dir).display());
    }
}
