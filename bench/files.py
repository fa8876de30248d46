"""The files API against cp: files.write + files.read of 10 MB vs `cp` of the same file.

    .venv/bin/python bench/files.py [--runs N] [--size MB] [--json FILE]

One namespace sandbox, its files view as a live sandbox has it (/proc/PID/root of a
command running inside). Each round, in a shuffled order:

  files         files.write(path, data) then files.read(path, format="bytes") of SIZE
                random bytes (the data already in memory; the read's bytes checked once)
  files.write   the write alone
  files.read    the read alone
  cp            subprocess.run(["cp", SRC, DST]) on the sandbox's scratch tmpfs seen from
                the host: the same filesystem, one read and one write of the file, plus a
                fork+exec (what a caller shelling out to cp pays)
  cp.inproc     shutil.copyfile(SRC, DST) (the copy alone, in this process)

Goal (issue 16): files >= 0.5x the speed of cp, i.e. files' median time <= 2x cp's.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import secrets
import shutil
import statistics
import subprocess
import sys
import threading
import time

GOAL_RATIO = 0.5
WARMUP = 2


def find_pid(argv: bytes) -> int | None:
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if f.read() == argv:
                    return int(pid)
        except OSError:
            pass
    return None


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=30)
    ap.add_argument("--size", type=int, default=10, help="MB")
    ap.add_argument("--json")
    ap.add_argument("--seed", type=int, default=16)
    a = ap.parse_args()

    import corral
    from corral.runtime.files import Caps, Files, open_root

    sb = corral.Sandbox({}).open()
    live = sb._live
    token = f"{900 + secrets.randbelow(10**6) / 10**6:.6f}"
    t = threading.Thread(target=sb.exec, args=(["sleep", token],), daemon=True)
    t.start()
    pid = None
    for _ in range(1000):
        pid = find_pid(b"sleep\0" + token.encode() + b"\0")
        if pid:
            break
        time.sleep(0.01)
    pidfd = os.pidfd_open(pid)
    root = open_root(pid, pidfd)
    files = Files(root, live.uid, live.gid, caps=Caps(read=1 << 30, write=1 << 30))
    os.close(root)

    size = a.size << 20
    data = os.urandom(size)
    host_dir = os.path.join(live.scratch, "home")
    src, dst = os.path.join(host_dir, "cp-src"), os.path.join(host_dir, "cp-dst")
    with open(src, "wb") as f:
        f.write(data)
    files.write("/scratch/api", data)
    assert files.read("/scratch/api", format="bytes") == data

    def v_files():
        files.write("/scratch/api", data)
        files.read("/scratch/api", format="bytes")

    variants = {
        "files": v_files,
        "files.write": lambda: files.write("/scratch/api", data),
        "files.read": lambda: files.read("/scratch/api", format="bytes"),
        "cp": lambda: subprocess.run(["cp", src, dst], check=True),
        "cp.inproc": lambda: shutil.copyfile(src, dst),
    }
    samples: dict[str, list[float]] = {k: [] for k in variants}
    rng = random.Random(a.seed)
    for rnd in range(a.runs + WARMUP):
        for name in rng.sample(list(variants), len(variants)):
            t0 = time.perf_counter()
            variants[name]()
            dt = time.perf_counter() - t0
            if rnd >= WARMUP:
                samples[name].append(dt * 1000)

    import signal

    signal.pidfd_send_signal(pidfd, 9)
    os.close(pidfd)
    t.join(30)
    files.close()
    sb.close()

    med = {k: statistics.median(v) for k, v in samples.items()}
    print(f"{a.size} MB, {a.runs} runs, median ms (p10-p90)")
    for k, v in samples.items():
        q = statistics.quantiles(v, n=10)
        print(f"  {k:12s} {med[k]:8.2f}   ({q[0]:.2f}-{q[-1]:.2f})")
    ratio = med["cp"] / med["files"]
    ratio_inproc = med["cp.inproc"] / med["files"]
    ok = ratio >= GOAL_RATIO
    print(f"files speed vs cp: {ratio:.2f}x (goal >= {GOAL_RATIO}x: "
          f"{'met' if ok else 'NOT met'}); vs an in-process copy: {ratio_inproc:.2f}x")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"size_mb": a.size, "runs": a.runs, "samples_ms": samples,
                       "median_ms": med, "ratio_vs_cp": ratio,
                       "ratio_vs_inproc_copy": ratio_inproc, "goal": GOAL_RATIO,
                       "met": ok}, f, indent=1)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
