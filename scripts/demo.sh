#!/usr/bin/env bash
# The main job: set everything up, then write a model with safetensors and
# numpy, read it back through zt (Python and CLI), and print a quick
# benchmark table.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/python -m harness.demo
