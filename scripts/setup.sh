#!/usr/bin/env bash
# Set up everything zt needs on a fresh machine: a virtualenv with the pinned
# Python packages, the native extension (release build, installed into the
# venv, with its `zt` command). Safe to run again: finished steps are skipped.
set -euo pipefail
cd "$(dirname "$0")/.."
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

echo "==> building the zt extension (release) and installing the package"
export VIRTUAL_ENV="$VENV" PATH="$VENV/bin:$PATH"
# The package brings the `zt` command ([project.scripts]: the Rust CLI inside
# the extension, the same program as the cargo binary `cargo build -p zt-cli`
# makes for Rust users). A link left by older setups would shadow it.
if [ -L "$VENV/bin/zt" ]; then rm "$VENV/bin/zt"; fi
maturin develop --release --quiet -m python/Cargo.toml >/dev/null
echo "==> ready: $VENV (python -c 'import zt'), CLI: $VENV/bin/zt"
