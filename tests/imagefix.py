"""The test suite's image, built once with mmdebstrap and kept across test runs.

It lives in its own store under CORRAL_TEST_CACHE (default /var/cache/corral-test), named
after the sha256 of its lock, so the next run of the suite finds it without building or
touching the network. The lock is written on the first build (corral image lock), and
written again only when the mirror has moved past it (a build from it refuses drift)."""

import hashlib
import os
import subprocess

import pytest
from conftest import CORRAL, ROOT

CACHE = os.environ.get("CORRAL_TEST_CACHE", "/var/cache/corral-test")
TOML = os.path.join(ROOT, "tests", "data", "mini-image.toml")


def corral_in(state, *args, check=True, timeout=600, **kw):
    env = dict(os.environ, CORRAL_STATE_DIR=state)
    p = subprocess.run([CORRAL, *args], capture_output=True, text=True, env=env,
                       timeout=timeout, check=False, **kw)
    if check:
        assert p.returncode == 0, (args, p.returncode, p.stderr[-2000:])
    return p


@pytest.fixture(scope="session")
def mini_image():
    """(state dir, image name, digest) of the cached trixie image; skips without mmdebstrap."""
    if not os.path.exists("/usr/bin/mmdebstrap") or os.geteuid() != 0:
        pytest.skip("needs root and mmdebstrap (scripts/setup.sh installs it)")
    state = os.path.join(CACHE, "state")
    os.makedirs(CACHE, 0o711, exist_ok=True)   # sandboxes' uids must reach the trees
    lock = os.path.join(CACHE, "mini-image.lock.json")
    with open(TOML, "rb") as f:
        toml_key = hashlib.sha256(f.read()).hexdigest()[:8]
    for attempt in (0, 1):
        fresh = None
        if not os.path.exists(lock):   # the first build writes the lock (one mmdebstrap run)
            p = corral_in(state, "image", "build", TOML, "--lock", lock, check=False)
            assert p.returncode == 0, p.stderr[-2000:]
            fresh = p.stdout.strip()
        with open(lock, "rb") as f:
            name = f"mini-{toml_key}-{hashlib.sha256(f.read()).hexdigest()[:12]}"
        if fresh:
            corral_in(state, "image", "tag", fresh, name)
        if corral_in(state, "image", "show", name, check=False).returncode == 0:
            break
        p = corral_in(state, "image", "build", TOML, "--lock", lock, "--name", name,
                      check=False)
        if p.returncode == 0:
            break
        if "drift" not in p.stderr or attempt:
            raise AssertionError(p.stderr[-2000:])
        os.unlink(lock)   # the mirror moved on: lock again
    digest = corral_in(state, "image", "show", name, "--json").stdout
    import json

    return state, name, json.loads(digest)["digest"]
