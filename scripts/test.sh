#!/usr/bin/env bash
# Run every test: formatting and lints, the Rust tests (unit, integration,
# doc), and the Python tests (which compare zt against the reference
# libraries and run the README's examples). Sets up first if needed.
set -euo pipefail
cd "$(dirname "$0")/.."
# No wheel cache: torch and its CUDA libraries alone would keep several GiB
# of downloads on a disk the build and the tests also need.
export PIP_NO_CACHE_DIR=1
bash scripts/setup.sh
export PATH="$(pwd)/.venv/bin:$PATH"

echo "==> cargo fmt / clippy"
cargo fmt --all -- --check
cargo clippy --workspace --all-targets --quiet -- -D warnings
echo "==> cargo doc (every doc link resolves and names a public item)"
RUSTDOCFLAGS="-D warnings" cargo doc --workspace --no-deps --quiet
echo "==> ruff"
ruff check python/zt tests harness
ruff format --check python/zt tests harness
echo "==> cargo test"
cargo test --workspace --quiet
echo "==> loaderx 2.8.19 in a Python 3.12 venv (.venv-loaderx28, requirements-loaderx28.txt)"
bash scripts/setup-loaderx28.sh
echo "==> Ray Data and Spark for the zrecord cluster-build tests (requirements-engines.txt)"
# Only the tests need them (tests/test_zrecord_ray.py, test_zrecord_spark.py),
# so they are installed here, not by setup.sh. pyspark 4 runs on Java 17+.
engines_stamp=.venv/.requirements-engines.sha
engines_want=$(sha256sum requirements-engines.txt | cut -d' ' -f1)
if [ "$(cat "$engines_stamp" 2>/dev/null)" != "$engines_want" ]; then
  python -m pip install --quiet -r requirements-engines.txt
  echo "$engines_want" > "$engines_stamp"
fi
if ! command -v java >/dev/null; then
  apt-get update -qq && apt-get install -y -qq default-jre-headless >/dev/null
fi
echo "==> pytest"
python -m pytest -q tests --ignore=tests/torch
echo "==> pytest: the PyTorch suite (tests/torch)"
torch_stamp=.venv/.requirements-torch.sha
torch_want=$(cat requirements-torch.txt requirements-torch-nodeps.txt | sha256sum | cut -d' ' -f1)
if [ "$(cat "$torch_stamp" 2>/dev/null)" != "$torch_want" ]; then
  echo "==> installing torch and tensordict (requirements-torch.txt, large download)"
  python -m pip install --quiet -r requirements-torch.txt
  python -m pip install --quiet --no-deps -r requirements-torch-nodeps.txt
  echo "$torch_want" > "$torch_stamp"
fi
python -m pytest -q tests/torch
