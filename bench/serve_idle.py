"""What N idle live sandboxes of `corral serve` hold: the server process's fds and threads
(/proc/PID/fd, /proc/PID/task), the host's processes below it, and memory (PSS of every
process below the server plus the server's own PSS growth, as bench/idle.py), per sandbox.

    .venv/bin/python bench/serve_idle.py none 1,10,50
    .venv/bin/python bench/serve_idle.py allow 1,10,50     # network allow: each a proxy

A real server (tests/fixtures/servefix.py), one token, sandboxes made over REST on the
namespace tier one after another; one made first as a warm-up and counted in the base.
Each figure is read 12 s after the last create (past runtime/live.ENTRANT_KEEP_S, until
which a sandbox keeps its next command's entrant, a forked copy of the server). Prints a
JSON line per N. What [server] max_sandboxes's default comes from (docs/service.md).
"""

import json
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "tests" / "fixtures"), str(ROOT / "bench")]
from memory import descendants, smaps  # noqa: E402
from servefix import Server  # noqa: E402

MB = 1024 * 1024


def pss(pid: int) -> int:
    return smaps(pid).get("Pss", 0)


def snap(pid: int):
    return (len(os.listdir(f"/proc/{pid}/fd")), len(os.listdir(f"/proc/{pid}/task")),
            descendants(pid))


def main() -> None:
    mode, ns = sys.argv[1], [int(x) for x in sys.argv[2].split(",")]
    tmp = Path(tempfile.mkdtemp(prefix="serve-idle-"))
    ceiling = tmp / "ceiling.toml"
    ceiling.write_text('[network]\nmode = "allow"\nallow = ["pypi.org"]\n'
                       if mode == "allow" else "")
    extra = ("--ceiling", str(ceiling)) if mode == "allow" else ()
    body = {"policy": {"network": {"mode": "allow", "allow": ["pypi.org"]}}} \
        if mode == "allow" else {}
    with Server(tmp, tokens=[("a", "--max-sandboxes", "1000", *extra)]) as s:
        pid = s.proc.pid
        h = s.http(s.tokens["a"])
        h.post("/sandboxes", json={**body, "timeout": 3000}).raise_for_status()
        time.sleep(12)
        fds0, thr0, kids0 = snap(pid)
        pss0 = pss(pid) + sum(pss(k) for k, _ in kids0)
        made = 0
        for n in ns:
            while made < n:
                h.post("/sandboxes", json={**body, "timeout": 3000}).raise_for_status()
                made += 1
            time.sleep(12)
            fds, thr, kids = snap(pid)
            names: dict[str, int] = {}
            for _, name in kids:
                names[name] = names.get(name, 0) + 1
            mem = pss(pid) + sum(pss(k) for k, _ in kids) - pss0
            print(json.dumps({"mode": mode, "n": n, "fds_per": round((fds - fds0) / n, 2),
                              "threads_per": round((thr - thr0) / n, 2),
                              "procs_per": round((len(kids) - len(kids0)) / n, 2),
                              "mb_per": round(mem / n / MB, 2), "server_fds": fds,
                              "server_threads": thr, "procs": names}), flush=True)


if __name__ == "__main__":
    main()
