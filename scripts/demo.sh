#!/usr/bin/env bash
# The main job: set everything up, then write a model with safetensors and
# numpy, read it back through zt (Python and CLI), and print a quick
# benchmark table.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
# grain's own venv (Python 3.12 or later: harness/loader_bench.py says why),
# made once here so that the quick tables below do not wait for it.
.venv/bin/python -m harness.loader_bench --grain-venv
exec .venv/bin/python -m harness.demo
