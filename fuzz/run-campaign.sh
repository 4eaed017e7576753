#!/usr/bin/env bash
# One fuzz campaign: build the libFuzzer binary (nightly, cargo-fuzz, ASan;
# one binary, `body`, runs every target, picked by ZT_FUZZ_TARGET) and run
# TARGET for SECONDS with issue 19's limits, seeded from the target's seed
# directories (a plugin's from its readers' `Format::fuzz`, the others from
# fuzz/bodies/src/seeds.rs). The growing corpus
# stays in fuzz/corpus/TARGET and crashes in fuzz/artifacts/TARGET (both
# ignored by git); a finding is minimized with
#   ZT_FUZZ_TARGET=TARGET cargo +nightly fuzz tmin --fuzz-dir fuzz/libfuzzer body fuzz/artifacts/TARGET/crash-...
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
  for t in $(cargo run -q -p zt-fuzz-bodies --example seed-dirs -- --list); do
    bash "$0" "$t" "$seconds"
  done
  exit 0
fi

mapfile -t seeds < <(cargo run -q -p zt-fuzz-bodies --example seed-dirs -- "$target")
[ "${#seeds[@]}" -gt 0 ] || { echo "run-campaign.sh: no fuzz target $target" >&2; exit 2; }
nice -n 19 cargo +nightly fuzz build --fuzz-dir fuzz/libfuzzer --target-dir "$fuzz_dir" body
mkdir -p "fuzz/corpus/$target" "fuzz/artifacts/$target"
# A target's libFuzzer dictionary, where it has one (the words of a text
# format mutation rarely spells: quant_config's JSON keys and edge numbers).
dict=()
[ -f "fuzz/dicts/$target.dict" ] && dict=(-dict="fuzz/dicts/$target.dict")
ZT_FUZZ_TARGET=$target nice -n 19 cargo +nightly fuzz run --fuzz-dir fuzz/libfuzzer --target-dir "$fuzz_dir" body \
  "fuzz/corpus/$target" "${seeds[@]}" -- \
  -rss_limit_mb=2048 -malloc_limit_mb=2048 -timeout=10 \
  -max_total_time="$seconds" -print_final_stats=1 "${dict[@]}" \
  -artifact_prefix="fuzz/artifacts/$target/"
