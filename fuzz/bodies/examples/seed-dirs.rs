//! For fuzz/run-campaign.sh: the seed directories of one fuzz target, one a
//! line (absolute), or with `--list` every target's name in campaign order:
//! `cargo run -q -p zt-fuzz-bodies --example seed-dirs -- TARGET|--list`.

fn main() {
    let arg = std::env::args()
        .nth(1)
        .expect("usage: seed-dirs TARGET|--list");
    if arg == "--list" {
        for target in zt_fuzz_bodies::targets() {
            println!("{}", target.name);
        }
        return;
    }
    let root = zt_fuzz_bodies::repo_root();
    let (_, dirs) = zt_fuzz_bodies::all_seed_dirs()
        .into_iter()
        .find(|(n, _)| *n == arg)
        .unwrap_or_else(|| panic!("no fuzz target {arg}"));
    for dir in dirs {
        println!("{}", root.join(dir).display());
    }
}
