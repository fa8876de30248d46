"""A foreground `sb.commands.run(..., on_stdout=, on_stderr=)` on a live sandbox streams
its output to the callbacks while it runs (issue 16), on each tier that keeps live
sandboxes: the command waits for a file that only the callback, having seen the
command's first line, writes (through sb.files, from the host side); it ends "ok" only if
that line reached the caller before it ended."""

from __future__ import annotations

import pytest
from conftest import tier_unavailable

import corral

WAIT = ("echo ready; echo warming >&2; i=0; while [ $i -lt 600 ]; do "
        "if [ -e /scratch/go ]; then echo seen; echo done >&2; exit 0; fi; "
        "sleep 0.05; i=$((i+1)); done; echo never; exit 3")


@pytest.mark.parametrize("tier", ["namespace", "gvisor"])
def test_foreground_output_reaches_the_callbacks_while_it_runs(tier):
    why = tier_unavailable(tier)
    if why:
        pytest.skip(f"{tier} tier: {why}")
    with corral.Sandbox.create({"isolation": tier}, timeout=120) as sb:
        out, err = [], []

        def on_stdout(data: bytes) -> None:
            out.append(data)
            if b"ready" in b"".join(out) and not sb.files.exists("/scratch/go"):
                sb.files.write("/scratch/go", "")

        r = sb.commands.run(WAIT, on_stdout=on_stdout, on_stderr=err.append, timeout=60)
        assert (r.verdict, r.exit_code) == ("ok", 0), r
        assert r.stdout == "ready\nseen\n" and r.stderr == "warming\ndone\n", r
        assert b"".join(out) == b"ready\nseen\n"
        assert b"".join(err) == b"warming\ndone\n"
