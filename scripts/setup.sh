#!/usr/bin/env bash
# Set up everything zt needs on a fresh machine: a virtualenv with the pinned
# Python packages, the native extension (release build, installed into the
# venv, with its `zt` command). Safe to run again: finished steps are skipped.
set -euo pipefail
cd "$(dirname "$0")/.."
# No wheel cache: torch and its CUDA libraries alone would keep several GiB
# of downloads on a disk the build and the tests also need.
export PIP_NO_CACHE_DIR=1
ROOT=$(pwd)
VENV="$ROOT/.venv"
PY=${PYTHON:-python3}

if [ ! -x "$VENV/bin/python" ]; then
  echo "==> creating $VENV"
  "$PY" -m venv "$VENV"
fi
stamp="$VENV/.requirements.sha"
want=$(cat requirements-dev.txt harness/requirements.txt 2>/dev/null | sha256sum | cut -d' ' -f1)
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  echo "==> installing Python packages"
  "$VENV/bin/python" -m pip install --quiet --upgrade pip
  "$VENV/bin/python" -m pip install --quiet -r requirements-dev.txt
  if [ -f harness/requirements.txt ]; then
    "$VENV/bin/python" -m pip install --quiet -r harness/requirements.txt
  fi
  echo "$want" > "$stamp"
fi

# Azurite (Microsoft's Azure Storage emulator, an npm package) for the
# object-storage tests, pinned, in the project-local .node/ (gitignored).
# 3.35.0 is the newest that runs on Node 20 (3.36 needs Node 21+).
AZURITE_VERSION=3.35.0
if [ "$(cat .node/.azurite-version 2>/dev/null)" != "$AZURITE_VERSION" ]; then
  echo "==> installing Azurite $AZURITE_VERSION (npm) into .node/"
  if ! command -v npm >/dev/null; then
    apt-get update -qq && apt-get install -y -qq nodejs npm >/dev/null
  fi
  mkdir -p .node
  npm install --prefix .node --no-audit --no-fund --no-save --loglevel=error \
    "azurite@$AZURITE_VERSION" >/dev/null
  echo "$AZURITE_VERSION" > .node/.azurite-version
fi

echo "==> building the zt extension (release) and installing the package"
export VIRTUAL_ENV="$VENV" PATH="$VENV/bin:$PATH"
# The package brings the `zt` command ([project.scripts]: the Rust CLI inside
# the extension, the same program as the cargo binary `cargo build -p zt-cli`
# makes for Rust users). A link left by older setups would shadow it.
if [ -L "$VENV/bin/zt" ]; then rm "$VENV/bin/zt"; fi
maturin develop --release --quiet -m python/Cargo.toml >/dev/null
echo "==> ready: $VENV (python -c 'import zt'), CLI: $VENV/bin/zt"
