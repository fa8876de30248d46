"""corral batch's progress on a terminal (issue 22: "progress (jobs done, rate, errors,
ETA) on a terminal"): stderr a real pty, the jobs real namespace-tier runs, one of them
refused (an error line), two already in the output file (resume). A pipe gets none of it
(tests/faces/test_batch.py::test_argv_code_stdin_and_files_jobs)."""

from __future__ import annotations

import json
import os
import re
import subprocess

import pytest
from conftest import CORRAL, tier_unavailable

pytestmark = pytest.mark.skipif(tier_unavailable("namespace") is not None,
                                reason=f"namespace tier: {tier_unavailable('namespace')}")


def _run_on_a_terminal(argv: list[str]) -> tuple[int, str]:
    """Exit status and everything written to stderr, which is the slave of a new pty."""
    master, slave = os.openpty()
    try:
        p = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                             stderr=slave)
    finally:
        os.close(slave)
    out = b""
    try:
        while True:
            try:
                chunk = os.read(master, 65536)
            except OSError:          # EIO: every holder of the slave is gone
                break
            if not chunk:
                break
            out += chunk
    finally:
        os.close(master)
    return p.wait(120), out.decode()


def test_progress_on_a_terminal_counts_done_errors_rate_and_eta(tmp_path):
    jobs = tmp_path / "jobs.jsonl"
    out = tmp_path / "out.jsonl"
    lines = [{"id": i, "argv": ["sh", "-c", f"echo {i}"]} for i in range(4)]
    lines.append({"id": "wide", "argv": ["true"], "policy": {"limits": {"pids": 100000}}})
    # the first two already ran (their lines are in the output file): skipped on resume
    jobs.write_text("".join(json.dumps(j) + "\n" for j in lines[:2]))
    first = subprocess.run([CORRAL, "batch", str(jobs), "--out", str(out)],
                           capture_output=True, text=True, timeout=120)
    assert first.returncode == 0 and first.stderr == "", first.stderr
    jobs.write_text("".join(json.dumps(j) + "\n" for j in lines))

    rc, err = _run_on_a_terminal([CORRAL, "batch", str(jobs), "--out", str(out),
                                  "--concurrency", "1"])
    assert rc == 1, err                       # one job not run
    assert f"2 of 5 jobs already in {out}: skipped" in err, err
    shown = [s for s in re.split(r"[\r\n]", err.replace("\x1b[K", ""))
             if s.startswith("corral batch: ") and " done, " in s]
    assert shown, err
    rx = re.compile(r"corral batch: (\d+)/3 done, (\d+\.\d)/s, (\d+) errors?, ETA (\S+)")
    seen = [rx.fullmatch(s) for s in shown]
    assert all(seen), shown
    done = [int(m.group(1)) for m in seen]
    assert done == sorted(done) and done[-1] == 3, shown
    last = seen[-1]
    assert last.group(3) == "1" and last.group(4) == "0s", shown
    assert float(last.group(2)) > 0
    assert err.endswith("\n") and "1 job(s) not run" in err
    # and the output file holds every job once, the refused one as an error line
    got = [json.loads(x) for x in out.read_text().splitlines()]
    assert sorted(str(x["id"]) for x in got) == ["0", "1", "2", "3", "wide"]
    assert "error" in next(x for x in got if x["id"] == "wide")
