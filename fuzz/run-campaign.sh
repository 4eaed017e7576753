#!/usr/bin/env bash
# One fuzz campaign: build the libFuzzer targets (nightly, cargo-fuzz, ASan)
# and run TARGET for SECONDS with issue 19's limits, seeded from the
# target's seed directories (fuzz/bodies/src/seeds.rs). The growing corpus
# stays in fuzz/corpus/TARGET and crashes in fuzz/artifacts/TARGET (both
# ignored by git); a finding is minimized with
#   cargo +nightly fuzz tmin --fuzz-dir fuzz/libfuzzer TARGET fuzz/artifacts/TARGET/crash-...
# and kept as fuzz/regressions/TARGET-WHAT, which `cargo test` replays.
#
#   bash fuzz/run-campaign.sh open_any 1800
#   bash fuzz/run-campaign.sh all 480        # every target in turn
#
# Needs: rustup's nightly toolchain and `cargo install cargo-fuzz --locked`.
# Runs under `nice -n 19`, one job (the machine is shared).
set -euo pipefail
cd "$(dirname "$0")/.."
target=${1:?usage: run-campaign.sh TARGET|all SECONDS}
seconds=${2:?usage: run-campaign.sh TARGET|all SECONDS}
fuzz_dir=${FUZZ_TARGET_DIR:-$(pwd)/fuzz/libfuzzer/target}

if [ "$target" = all ]; then
  for t in $(sed -n 's/^name = "\(.*\)"$/\1/p' fuzz/libfuzzer/Cargo.toml | grep -v '^zt-fuzz$'); do
    bash "$0" "$t" "$seconds"
  done
  exit 0
fi

nice -n 19 cargo +nightly fuzz build --fuzz-dir fuzz/libfuzzer --target-dir "$fuzz_dir" "$target"
mapfile -t seeds < <(cargo run -q -p zt-fuzz-bodies --example seed-dirs -- "$target")
mkdir -p "fuzz/corpus/$target" "fuzz/artifacts/$target"
nice -n 19 cargo +nightly fuzz run --fuzz-dir fuzz/libfuzzer --target-dir "$fuzz_dir" "$target" \
  "fuzz/corpus/$target" "${seeds[@]}" -- \
  -rss_limit_mb=2048 -malloc_limit_mb=2048 -timeout=10 \
  -max_total_time="$seconds" -print_final_stats=1 \
  -artifact_prefix="fuzz/artifacts/$target/"
