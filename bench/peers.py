"""The peers measured side by side with corral, installed from npm into bench/.peers/.

    .venv/bin/python bench/peers.py            # install (npm ci) if needed, print the configs

bench/peers/package.json and package-lock.json pin the versions and their sha512
integrity; `npm ci` installs exactly that into the ignored bench/.peers/. Each peer is
configured as close as it allows to corral's default policy: no network, read-only root,
one writable scratch directory. The exact argv, settings and environment are returned by
`configure()` and written into the benchmark's JSON.
"""

from __future__ import annotations

import filecmp
import glob
import json
import os
import shutil
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
PINS = os.path.join(HERE, "peers")          # committed: package.json + package-lock.json
DIR = os.path.join(HERE, ".peers")          # ignored: node_modules, codex-home, settings
NM = os.path.join(DIR, "node_modules")


def _out(argv: list[str], **kw) -> str:
    try:
        p = subprocess.run(argv, check=False, capture_output=True, text=True, timeout=60, **kw)
    except (OSError, subprocess.SubprocessError) as e:
        return f"unavailable ({e})"
    text = (p.stdout or p.stderr).strip()
    return text.splitlines()[0] if text else f"exit {p.returncode}"


def install(log=print) -> str | None:
    """npm ci into bench/.peers/ unless the same lock is installed. None, or why not."""
    npm = shutil.which("npm")
    if not shutil.which("node") or not npm:
        return "node/npm not installed (apt-get install nodejs npm)"
    os.makedirs(DIR, exist_ok=True)
    lock, here = os.path.join(PINS, "package-lock.json"), os.path.join(DIR, "package-lock.json")
    stamp = os.path.join(NM, ".package-lock.json")
    if os.path.exists(here) and os.path.exists(stamp) and filecmp.cmp(lock, here, shallow=False):
        return None
    for f in ("package.json", "package-lock.json"):
        shutil.copyfile(os.path.join(PINS, f), os.path.join(DIR, f))
    log(f"installing the peers: npm ci in {DIR} (pinned by {lock})")
    p = subprocess.run(check=False, args=[npm, "ci", "--no-audit", "--no-fund", "--loglevel=error"], cwd=DIR,
                       capture_output=True, text=True, timeout=900)
    if p.returncode != 0:
        return f"npm ci failed (exit {p.returncode}): {(p.stderr or p.stdout).strip()[-800:]}"
    return None


def codex_native() -> str | None:
    hits = sorted(glob.glob(os.path.join(NM, "@openai", "codex-linux-*", "vendor", "*", "bin",
                                         "codex")))
    return hits[0] if hits else None


def configure(scratch: str) -> tuple[dict, dict]:
    """({name: spec}, {name: why not}) for srt, codex-npm and codex-native.

    spec: argv_prefix (the command follows), env, cwd, config (what to record), version."""
    peers: dict[str, dict] = {}
    errors: dict[str, str] = {}
    node = shutil.which("node")
    node_v = _out([node, "--version"]) if node else "not installed"
    base_env = dict(os.environ)

    # -- Anthropic sandbox-runtime -------------------------------------------------------
    srt_js = os.path.join(NM, "@anthropic-ai", "sandbox-runtime", "dist", "cli.js")
    if not node or not os.path.exists(srt_js):
        errors["srt"] = "not installed (bench/peers.py: npm ci failed or node missing)"
    else:
        settings = {
            # allowedDomains [] = "block all network" (srt still starts its HTTP/SOCKS
            # proxy and the socat bridges: that is how srt denies, it has no proxy-less mode)
            "network": {"allowedDomains": [], "deniedDomains": []},
            # reads: srt's default (the whole host, minus its mandatory denies); writes:
            # only the scratch directory (srt also always allows /dev/null etc. and /tmp/claude)
            "filesystem": {"denyRead": [], "allowWrite": [scratch], "denyWrite": []},
        }
        path = os.path.join(DIR, "srt-settings.json")
        with open(path, "w") as f:
            json.dump(settings, f, indent=1)
        env = dict(base_env)
        rg_note = "rg from PATH"
        if not shutil.which("rg"):  # srt refuses to start without ripgrep
            native = codex_native()
            rg_dir = os.path.join(os.path.dirname(os.path.dirname(native)), "codex-path") \
                if native else None
            if rg_dir and os.path.exists(os.path.join(rg_dir, "rg")):
                env["PATH"] = rg_dir + os.pathsep + env.get("PATH", "")
                rg_note = f"rg: none on PATH, so Codex's vendored {rg_dir}/rg is put first"
            else:
                errors["srt"] = "srt needs ripgrep (rg) and none was found"
        if "srt" not in errors:
            peers["srt"] = {
                "label": "srt (Anthropic sandbox-runtime, node)",
                "argv_prefix": [node, srt_js, "--settings", path, "--"],
                "env": env, "cwd": scratch, "config": settings,
                "notes": [rg_note, (f"node {node_v} (srt's package.json asks for >= 22.12; "
                          "it runs on this one)"), f"cwd {scratch}"],
                "version": _out([node, srt_js, "--version"]),
            }

    # -- OpenAI Codex: the npm launcher (node) and the native binary it ships ------------
    home = os.path.join(DIR, "codex-home")  # not under /tmp: codex refuses helper links there
    os.makedirs(home, exist_ok=True)
    cenv = dict(base_env, CODEX_HOME=home)
    # -P :workspace = Codex's built-in workspace-write profile: root read-only, the cwd
    # (-C) and /tmp writable, network off (its own netns + seccomp denying AF_INET sockets)
    tail = ["sandbox", "-P", ":workspace", "-C", scratch, "--"]
    launcher = os.path.join(NM, "@openai", "codex", "bin", "codex.js")
    native = codex_native()
    if not node or not os.path.exists(launcher):
        errors["codex-npm"] = "not installed (bench/peers.py: npm ci failed or node missing)"
    else:
        peers["codex-npm"] = {
            "label": "codex sandbox (npm launcher, node)",
            "argv_prefix": [node, launcher, *tail], "env": cenv, "cwd": scratch,
            "config": {"CODEX_HOME": home, "argv": ["codex", *tail, "CMD..."]},
            "notes": [f"node {node_v}"],
            "version": _out([node, launcher, "--version"], env=cenv),
        }
    if not native:
        errors["codex-native"] = "no vendor/*/bin/codex in @openai/codex-linux-* (not installed)"
    else:
        peers["codex-native"] = {
            "label": "codex sandbox (native binary)",
            "argv_prefix": [native, *tail], "env": cenv, "cwd": scratch,
            "config": {"CODEX_HOME": home, "argv": [native, *tail, "CMD..."]},
            "notes": ["the musl binary the npm launcher execs"],
            "version": _out([native, "--version"], env=cenv),
        }
    return peers, errors


def public(spec: dict) -> dict:
    """A spec without its environment (it is the caller's, possibly with secrets)."""
    out = {k: v for k, v in spec.items() if k != "env"}
    if "env" in spec:
        out["env_changes"] = {k: v for k, v in spec["env"].items() if os.environ.get(k) != v}
    return out


if __name__ == "__main__":
    err = install()
    if err:
        print(err, file=sys.stderr)
    p, e = configure(os.path.join(DIR, "scratch"))
    print(json.dumps({"peers": {k: public(v) for k, v in p.items()}, "errors": e}, indent=1))
