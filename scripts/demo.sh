#!/usr/bin/env bash
# Sets corral up (scripts/setup.sh) and runs the demo: an untrusted script that tries to
# steal secrets, reach the network, delete files and fork-bomb, run under `corral run`.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/python examples/demo.py "$@"
