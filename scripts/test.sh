#!/usr/bin/env bash
# Sets corral up (scripts/setup.sh) and runs the whole test suite. Exit status: pytest's,
# except that "no tests ran" (pytest's 5) is a failure too.
set -uo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh || exit 1
.venv/bin/python -m pytest -q -p no:cacheprovider "$@"
rc=$?
if [ $rc -eq 5 ]; then
  echo "test.sh: pytest collected no tests; that is a failure" >&2
  exit 1
fi
exit $rc
