#!/usr/bin/env bash
# Sets corral up on a Debian 12 machine, as root: the system packages it drives, then a
# virtual environment built from Debian's /usr/bin/python3 with the locked, hashed
# dependency set, and corral itself installed in it (.venv/bin/corral).
# Safe to run again: each step is skipped when already done.
set -euo pipefail
cd "$(dirname "$0")/.."

apt_packages=(bubblewrap runsc gcc libc6-dev python3-dev dnsmasq-base python3-seccomp python3-venv socat curl git iproute2 python3-requests mmdebstrap qemu-system-x86 squashfs-tools busybox-static chromium nginx)
missing=()
for p in "${apt_packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  if [ "$(id -u)" -ne 0 ]; then
    echo "setup: missing Debian packages: ${missing[*]}; run this script as root (or apt-get install them)" >&2
    exit 1
  fi
  echo "setup: installing ${missing[*]}" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  # nginx is for the E2B_DOMAIN test's reverse proxy, which starts its own: a default
  # instance the package may have started (port 80) is not ours to keep
  if [[ " ${missing[*]} " == *" nginx "* ]]; then nginx -s quit 2>/dev/null || true; fi
fi

lock=requirements/dev.lock
stamp=.venv/.corral-lock.sha256
want=$(sha256sum "$lock" pyproject.toml | sha256sum | cut -d' ' -f1)
if [ ! -x .venv/bin/python ] || [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  echo "setup: building .venv from /usr/bin/python3 and $lock" >&2
  rm -rf .venv
  /usr/bin/python3 -m venv .venv
  .venv/bin/pip install -q --require-hashes --no-deps -r "$lock" 2> >(grep -v "is ignored: it is neither" >&2)
  .venv/bin/pip install -q --no-deps --no-build-isolation -e .
  # libseccomp's own Python binding comes from Debian (python3-seccomp), built for this
  # very interpreter; link just that module into the venv rather than every system package.
  site=$(.venv/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  for so in /usr/lib/python3/dist-packages/seccomp.cpython-*.so; do ln -sf "$so" "$site/"; done
  echo "$want" > "$stamp"
fi
# bench/.venv: matplotlib, ipykernel and jupyter_client from their own hashed lock, for
# bench/ and for the tests that run a real Jupyter kernel or a matplotlib figure in a
# sandbox (tests/tiers/test_live_code.py, test_run_code.py mount it read-only); kept out
# of .venv, whose pins they would have to share. Rebuilt only when the lock changes.
block=requirements/bench.lock
bstamp=bench/.venv/.corral-lock.sha256
bwant=$(sha256sum "$block" | cut -d' ' -f1)
if [ ! -x bench/.venv/bin/python ] || [ "$(cat "$bstamp" 2>/dev/null)" != "$bwant" ]; then
  echo "setup: building bench/.venv from /usr/bin/python3 and $block" >&2
  rm -rf bench/.venv
  /usr/bin/python3 -m venv bench/.venv
  bench/.venv/bin/pip install -q --disable-pip-version-check --require-hashes --only-binary=:all: -r "$block" \
    2> >(grep -v "is ignored: it is neither" >&2)
  echo "$bwant" > "$bstamp"
fi
# corral.linux._csys: the libc calls the standard library lacks (mount, prctl, prlimit,
# raw syscalls) as a small C module of corral's own (src/corral/linux/_csys.c), where ctypes
# costs every `corral run` 0.5 to 3 ms of CPU (its load, its types, each function's first
# call: docs/architecture.md); corral falls back on ctypes without it.
# Built for the venv's interpreter, again whenever the source is newer than the module.
ext=$(.venv/bin/python -c 'import sysconfig; print(sysconfig.get_config_var("EXT_SUFFIX"))')
csys=src/corral/linux/_csys$ext
if [ ! -f "$csys" ] || [ src/corral/linux/_csys.c -nt "$csys" ]; then
  inc=$(.venv/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["include"])')
  gcc -shared -fPIC -O2 -g0 -Wall -Wextra -Wno-unused-parameter -Werror \
    -fstack-protector-strong -D_FORTIFY_SOURCE=2 -Wl,-z,relro,-z,now \
    -I"$inc" -o "$csys.tmp" src/corral/linux/_csys.c
  mv -f "$csys.tmp" "$csys"
fi
# the launcher (.venv/bin/corral) and its run-path file (corral/_runpath.py): pip's template
# imports `re`; this one runs in isolated mode (-I: no PYTHON* variables, no user site, no
# current directory on sys.path) without the site module (-S, written -IS: a #! line passes
# one argument; no .pth processing, no sitecustomize; ~2 ms of every start), puts corral's
# source and the venv's site-packages on sys.path itself (all a .pth here would add),
# starts with the cyclic GC off (the run path's imports set off ~1 ms of collections;
# corral.cli.gc_back_on() turns it on, with those objects frozen, before a command starts)
# and loads the modules of `corral run` from one file (.venv/corral-runpath) while their
# sources are unchanged; writing it runs `corral run -- /bin/true` twice and `run --json`
# twice (a state directory of their own) to trace which functions a run calls: the others
# are loaded from the file on first use (nothing moves if those runs cannot run here)
site=$(.venv/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
.venv/bin/python -m corral._runpath .venv/bin/corral .venv/corral-runpath "$PWD/src" "$site" >/dev/null
# setuptools' distutils shim costs every start a little and corral does not need it
rm -f .venv/lib/python3*/site-packages/distutils-precedence.pth
# Moving a process into a cgroup waits out an RCU grace period (~10 ms on an idle host)
# unless the cgroup2 mount favours dynamic modifications; the setting is host-wide and one
# mount is enough. corral moves every sandbox into its own cgroup, so ask for it.
if [ "$(id -u)" -eq 0 ]; then
  for m in /sys/fs/cgroup/unified /sys/fs/cgroup; do
    if [ "$(stat -f -c %T "$m" 2>/dev/null)" = cgroup2fs ]; then
      grep -q " $m cgroup2 .*favordynmods" /proc/mounts ||
        mount -o remount,favordynmods "$m" 2>/dev/null ||
        echo "setup: could not set favordynmods on $m; sandbox start-up pays ~10 ms more" >&2
      break
    fi
  done
fi
# byte-compile corral (PYTHONDONTWRITEBYTECODE may be set): `corral run` starts faster
.venv/bin/python -m compileall -q src/corral >/dev/null
.venv/bin/python -c 'import corral, seccomp' || { echo "setup: the venv is broken; delete .venv and run again" >&2; exit 1; }
# the microvm tier's guest kernel: Debian's cloud kernel package, pinned by version and
# sha256 in src/corral/backends/microvm_assets.py, extracted into corral's state dir
if [ "$(id -u)" -eq 0 ]; then
  .venv/bin/python -m corral.backends.microvm_assets >/dev/null ||
    echo "setup: could not install the microvm tier's guest kernel (the microvm tier is unavailable)" >&2
fi
