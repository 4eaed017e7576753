#!/usr/bin/env bash
# Create .venv-loaderx28: Python 3.12 with loaderx 2.8.19, pinned in
# requirements-loaderx28.txt. loaderx 2.8 needs Python >= 3.12 and
# numpy >= 2.5, so it lives beside .venv (3.11, loaderx 2.3.8) and the tests
# (tests/test_loaderx28.py) and the harness run it as a subprocess.
# Installed once: a stamp holds the requirements' hash. Python 3.12 comes from
# $PYTHON312, else pyenv's newest 3.12, else python3.12 on PATH.
set -euo pipefail
cd "$(dirname "$0")/.."
# No wheel cache: torch and its CUDA libraries alone would keep several GiB
# of downloads on a disk the build and the tests also need.
export PIP_NO_CACHE_DIR=1
VENV=.venv-loaderx28
stamp="$VENV/.requirements.sha"
want=$(sha256sum requirements-loaderx28.txt | cut -d' ' -f1)
if [ -x "$VENV/bin/python" ] && [ "$(cat "$stamp" 2>/dev/null)" = "$want" ]; then
  exit 0
fi
is312() { [ -n "$1" ] && "$1" -c 'import sys; assert sys.version_info[:2] == (3, 12)' 2>/dev/null; }
py=${PYTHON312:-}
if ! is312 "$py"; then
  # pyenv's own interpreters first: its shims on PATH run whatever version
  # pyenv selects for this directory, which need not be 3.12.
  root=${PYENV_ROOT:-$HOME/.pyenv}
  py=""
  for candidate in $(ls -d "$root"/versions/3.12.*/bin/python3.12 2>/dev/null | sort -rV) "$(command -v python3.12 || true)"; do
    if is312 "$candidate"; then
      py=$candidate
      break
    fi
  done
fi
if ! is312 "$py"; then
  echo "scripts/setup-loaderx28.sh: no Python 3.12 found (set PYTHON312, or install 3.12 with pyenv)" >&2
  exit 1
fi
echo "==> creating $VENV with $py and installing requirements-loaderx28.txt"
rm -rf "$VENV"
"$py" -m venv "$VENV"
"$VENV/bin/python" -m pip install --quiet --upgrade pip
"$VENV/bin/python" -m pip install --quiet -r requirements-loaderx28.txt
echo "$want" > "$stamp"
