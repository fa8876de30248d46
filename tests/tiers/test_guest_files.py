"""The guest-side files API (runtime/guest_files.py, the microvm tier's) against a hostile
guest, on a real namespace sandbox whose `python3` (what the helper runs as) is the
sandbox's own script."""

import pytest
from conftest import tier_unavailable

import corral
from corral.runtime import guest_files
from corral.runtime.files import FilesError

pytestmark = pytest.mark.skipif(tier_unavailable("namespace") is not None,
                                reason=f"namespace tier: {tier_unavailable('namespace')}")


def test_an_error_answer_is_bounded_before_it_is_parsed():
    """A listing may answer up to ~20 MB, but an error (exit 3) is one small object: a
    guest answering 8 MB of `[[[[` with exit 3 is refused on its size, never handed to
    the JSON parser (up to the listing's bound, ~80 MB of objects for a list of zeros)."""
    sb = corral.Sandbox.create({"isolation": "namespace",
                                "env": {"set": {"PATH": "/scratch/bin:/usr/bin:/bin"}}},
                               timeout=120)
    try:
        r = sb.commands.run(["/bin/sh", "-c",
                             "mkdir -p /scratch/bin && printf '#!/bin/sh\\nhead -c 8000000 "
                             "/dev/zero | tr \"\\\\0\" \"[\"\\nexit 3\\n' > /scratch/bin/python3"
                             " && chmod +x /scratch/bin/python3"])
        assert r.exit_code == 0, r.stderr
        files = guest_files.GuestFiles(sb, cwd="/")
        with pytest.raises(FilesError, match=f"error answer was over {guest_files.ANSWER_MAX}"):
            files.list("/")
    finally:
        sb.kill()
