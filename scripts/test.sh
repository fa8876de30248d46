#!/usr/bin/env bash
# Sets corral up (scripts/setup.sh) and runs the whole test suite. Exit status: pytest's,
# except that "no tests ran" (pytest's 5) is a failure too.
set -uo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh || exit 1
# Some tests run corral as an ordinary user (uid 65534), which must be able to reach the
# checkout: give "others" search permission (x, not read) on the directories above it.
if [ "$(id -u)" -eq 0 ]; then
  p=$PWD
  while [ "$p" != / ]; do
    [ -n "$(find "$p" -maxdepth 0 -perm -o+x)" ] || { chmod o+x "$p" && echo "test.sh: chmod o+x $p" >&2; }
    p=$(dirname "$p")
  done
fi
# lint first: a pyflakes error (an undefined name in a path no test reaches) fails the run
.venv/bin/ruff check src tests bench || { echo "test.sh: ruff check failed" >&2; exit 1; }
# With arguments: those tests only. Without: the default suite (not marked slow), then the
# slow group (the whole probe catalogue, real pip installs, two image builds), each with
# its slowest tests listed. "No tests ran" (pytest's 5) is a failure in either.
run() {
  .venv/bin/python -m pytest -q -p no:cacheprovider "$@"
  local rc=$?
  if [ $rc -eq 5 ]; then
    echo "test.sh: pytest collected no tests ($*); that is a failure" >&2
    return 1
  fi
  return $rc
}
if [ $# -gt 0 ]; then
  run "$@"
  exit $?
fi
run -m "not slow" --durations=15
rc=$?
run -m slow --durations=10
rc2=$?
[ $rc -ne 0 ] && exit $rc
exit $rc2
