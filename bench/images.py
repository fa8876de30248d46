"""Images and the install phase (issue 15): medians side by side, in one run, as ratios.

    CORRAL_STATE_DIR=... .venv/bin/python bench/images.py [--image python] [--runs N]
                                       [--install-runs N] [--builds N] [--only A,B] [--json F]

  install   10 wheels (downloaded once from PyPI with pip download, then served on loopback
            by http.server) installed by `corral install --image IMAGE` (the sandbox whose
            network reaches only that index, the layer committed to the store) against
            `python3 -m pip install --target DIR` on the host from the same index (goal:
            at most 1.3x). The result (the image plus one layer) is kept for `startup`.
  startup   corral.run(/bin/true) and (python3 -c pass) on namespace: the host root vs the
            image (goal: within 5%), and vs the image with the install's layer (an overlay
            mounted once, shared), round robin, shuffled, warm-up rounds dropped; wall
            time, and CPU time (corral and its children), which a loaded machine
            disturbs less
  build     `corral image build tests/fixtures/data/mini-image.toml --lock L` into a fresh
            store: cold (unlocked, writes L), then from L with --no-cache (a full
            mmdebstrap run that must give the same digest), then from L again (from the
            cache: the image built from L is returned, nothing runs)
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CORRAL = os.path.join(ROOT, ".venv", "bin", "corral")
WHEELS = ["six==1.16.0", "idna==3.7", "certifi==2024.7.4", "charset-normalizer==3.3.2",
          "urllib3==2.2.2", "requests==2.32.3", "attrs==23.2.0", "packaging==24.1",
          "pyparsing==3.1.2", "tomli==2.0.1"]
CACHE = os.environ.get("CORRAL_BENCH_CACHE", "/var/cache/corral-bench")


def med(xs):
    return statistics.median(xs) if xs else float("nan")


def startup(image: str, runs: int, seed: int, layered: str | None = None) -> dict:
    import corral

    roots = ["host", image] + ([layered] if layered else [])
    variants = {}
    for cmd in (["/bin/true"], ["/usr/bin/python3", "-c", "pass"]):
        for root in roots:
            pol = {"isolation": "namespace"} | ({"image": root} if root != "host" else {})
            variants[(root, cmd[0])] = (pol, cmd)
    samples = {k: [] for k in variants}
    cpu = {k: [] for k in variants}   # CPU time (corral + its children): load-robust
    rng = random.Random(seed)
    for rnd in range(runs + 2):
        for key in rng.sample(list(variants), len(variants)):
            pol, cmd = variants[key]
            c0 = _cpu()
            t0 = time.perf_counter()
            r = corral.run(cmd, policy=pol)
            dt = time.perf_counter() - t0
            dc = _cpu() - c0
            if r.exit_code != 0:
                raise SystemExit(f"{key}: {r.verdict} {r.stderr[-300:]!r}")
            if rnd >= 2:
                samples[key].append(dt * 1000)
                cpu[key].append(dc * 1000)
    out = {}
    for cmd in ("/bin/true", "/usr/bin/python3"):
        h, i = med(samples[("host", cmd)]), med(samples[(image, cmd)])
        hc, ic = med(cpu[("host", cmd)]), med(cpu[(image, cmd)])
        out[cmd] = {"host_ms": h, "image_ms": i, "ratio": i / h, "goal": 1.05,
                    "cpu_host_ms": hc, "cpu_image_ms": ic, "cpu_ratio": ic / hc,
                    "samples": {"host": samples[("host", cmd)], "image": samples[(image, cmd)]}}
        if layered:
            lay, lc = med(samples[(layered, cmd)]), med(cpu[(layered, cmd)])
            out[cmd].update(layered_ms=lay, layered_ratio=lay / h, cpu_layered_ms=lc,
                            cpu_layered_ratio=lc / hc)
            out[cmd]["samples"]["layered"] = samples[(layered, cmd)]
    return out


def _cpu() -> float:
    """CPU seconds of this process and its reaped children (bwrap, the command)."""
    import resource

    a, b = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return a.ru_utime + a.ru_stime + b.ru_utime + b.ru_stime


def corral_cmd(state: str, *args, timeout=1800) -> subprocess.CompletedProcess:
    env = dict(os.environ, CORRAL_STATE_DIR=state)
    return subprocess.run([CORRAL, *args], env=env, capture_output=True, text=True,
                          timeout=timeout, stdin=subprocess.DEVNULL)


def build(builds: int) -> dict:
    toml = os.path.join(ROOT, "tests", "fixtures", "data", "mini-image.toml")
    os.makedirs(CACHE, 0o711, exist_ok=True)
    out = {"cold_s": [], "rebuild_s": [], "cached_s": [], "same_digest": [], "said_so": []}
    for _ in range(builds):
        state = tempfile.mkdtemp(prefix="build-", dir=CACHE)
        os.chmod(state, 0o711)
        lock = os.path.join(state, "lock.json")
        try:
            runs = {}
            for what, extra in (("cold_s", ()), ("rebuild_s", ("--no-cache",)),
                                ("cached_s", ())):
                t0 = time.monotonic()
                p = corral_cmd(state, "image", "build", toml, "--lock", lock, *extra)
                out[what].append(time.monotonic() - t0)
                if p.returncode != 0:
                    raise SystemExit(f"build ({what}): " + p.stderr[-500:])
                runs[what] = p
            out["same_digest"].append(len({p.stdout.strip() for p in runs.values()}) == 1)
            out["said_so"].append("from cache" in runs["cached_s"].stderr
                                  and "from cache" not in runs["rebuild_s"].stderr)
        finally:
            from corral.images.store import remove_tree

            remove_tree(state)
    for k in ("cold", "rebuild", "cached"):
        out[f"{k}_median_s"] = med(out[f"{k}_s"])
    out["cached_vs_cold"] = out["cached_median_s"] / out["cold_median_s"]
    out["rebuild_vs_cold"] = out["rebuild_median_s"] / out["cold_median_s"]
    return out


def install(image: str, runs: int, seed: int) -> dict:
    wheels = os.path.join(CACHE, "wheels")
    if not os.path.isdir(wheels) or len(os.listdir(wheels)) < len(WHEELS):
        os.makedirs(wheels, exist_ok=True)
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary",
                        ":all:", "-d", wheels, *WHEELS], check=True, capture_output=True)
    root = tempfile.mkdtemp(prefix="index-", dir=CACHE)
    os.chmod(root, 0o755)
    for f in sorted(os.listdir(wheels)):
        name = f.split("-")[0].lower().replace("_", "-")
        d = os.path.join(root, "simple", name)
        os.makedirs(d, exist_ok=True)
        shutil.copy(os.path.join(wheels, f), os.path.join(root, f))
        with open(os.path.join(d, "index.html"), "a") as out:
            out.write(f'<a href="/{f}">{f}</a>\n')
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    srv = subprocess.Popen(["/usr/bin/python3", "-m", "http.server", "--bind", "127.0.0.1",
                            "--directory", root, str(port)], stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL)
    time.sleep(1.0)
    url = f"http://127.0.0.1:{port}/simple"
    names = [w.split("==")[0] for w in WHEELS]
    state = os.environ.get("CORRAL_STATE_DIR") or ""
    samples = {"corral": [], "host": []}
    cpu = {"corral": [], "host": []}   # CPU time of the whole process tree: load-robust
    rng = random.Random(seed)
    try:
        for rnd in range(runs + 1):
            for v in rng.sample(list(samples), 2):
                target = None
                c0 = _cpu()
                t0 = time.monotonic()
                if v == "corral":
                    p = corral_cmd(state, "install", "--image", image, "--index-url", url,
                                   "--name", "bench-install", *names)
                else:
                    target = tempfile.mkdtemp(prefix="target-", dir=CACHE)
                    p = subprocess.run(["/usr/bin/python3", "-m", "pip", "install", "--no-input",
                                        "--disable-pip-version-check", "--no-cache-dir",
                                        "--only-binary", ":all:", "--index-url", url,
                                        "--target", target, *names],
                                       env={"PATH": "/usr/bin:/bin", "HOME": target,
                                            "PIP_CONFIG_FILE": os.devnull},
                                       capture_output=True, text=True)
                dt = time.monotonic() - t0   # pip's time only (corral's: the layer stored)
                dc = _cpu() - c0
                if target:
                    shutil.rmtree(target)
                if p.returncode != 0:
                    raise SystemExit(f"{v}: {p.stderr[-500:]}")
                if rnd >= 1:
                    samples[v].append(dt)
                    cpu[v].append(dc)
    finally:
        srv.terminate()
        shutil.rmtree(root)
    c, h = med(samples["corral"]), med(samples["host"])
    cc, hc = med(cpu["corral"]), med(cpu["host"])
    return {"corral_s": c, "host_pip_s": h, "ratio": c / h, "goal": 1.3, "samples": samples,
            "cpu_corral_s": cc, "cpu_host_s": hc, "cpu_ratio": cc / hc, "cpu": cpu,
            "packages": WHEELS}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--image", default="python")
    ap.add_argument("--runs", type=int, default=15)
    ap.add_argument("--install-runs", type=int, default=3)
    ap.add_argument("--builds", type=int, default=1)
    ap.add_argument("--seed", type=int, default=15)
    ap.add_argument("--only", default="install,startup,build")
    ap.add_argument("--json")
    a = ap.parse_args()
    only = a.only.split(",")
    state = os.environ.get("CORRAL_STATE_DIR") or ""
    doc = {"loadavg_before": os.getloadavg(), "image": a.image}
    lines = []

    def say(line: str) -> None:
        lines.append(line)
        print(line, flush=True)

    layered = None
    if "install" in only:
        doc["install"] = r = install(a.image, a.install_runs, a.seed)
        say(f"install 10 wheels    host pip {r['host_pip_s']:6.2f} s   corral install "
            f"{r['corral_s']:6.2f} s   corral/host {r['ratio']:.2f}   (goal <= {r['goal']})")
        say(f"  cpu time           host pip {r['cpu_host_s']:6.2f} s   corral install "
            f"{r['cpu_corral_s']:6.2f} s   corral/host {r['cpu_ratio']:.2f}")
        layered = "bench-install"
    try:
        if "startup" in only:
            doc["startup"] = st = startup(a.image, a.runs, a.seed, layered)
            for cmd, r in st.items():
                line = (f"startup {cmd:<16} host {r['host_ms']:6.1f} ms  image "
                        f"{r['image_ms']:6.1f} ms  image/host {r['ratio']:.3f}")
                if layered:
                    line += (f"  +layer {r['layered_ms']:6.1f} ms  +layer/host "
                             f"{r['layered_ratio']:.3f}")
                say(line + f"   (goal <= {r['goal']})")
                line = (f"  cpu time {cmd:<13} host {r['cpu_host_ms']:6.1f} ms  image "
                        f"{r['cpu_image_ms']:6.1f} ms  image/host {r['cpu_ratio']:.3f}")
                if layered:
                    line += (f"  +layer {r['cpu_layered_ms']:6.1f} ms  +layer/host "
                             f"{r['cpu_layered_ratio']:.3f}")
                say(line)
    finally:
        if layered:
            corral_cmd(state, "image", "rm", layered)
    if "build" in only:
        doc["build"] = r = build(a.builds)
        say(f"build mini image     cold {r['cold_median_s']:6.1f} s   rebuild from the lock "
            f"(--no-cache) {r['rebuild_median_s']:6.1f} s   from the cache "
            f"{r['cached_median_s']:6.2f} s   cache/cold {r['cached_vs_cold']:.3f}   "
            f"same digest {all(r['same_digest'])}, said so {all(r['said_so'])}")
    doc["loadavg_after"] = os.getloadavg()
    say(f"load average before {doc['loadavg_before']}, after {doc['loadavg_after']} "
        f"on {os.cpu_count()} CPUs (a shared machine: indicative)")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(doc, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
