"""`corral verify` on receipts built to be read two ways or to break the reader: a key
given twice in one object (json keeps the last; another reader may show the first, so a
receipt could verify here and say something else there) and nesting deep enough to raise
RecursionError. Each is malformed: exit 10 with one line on stderr, no traceback. Real
receipts signed with a real host key (audit/receipt.sign in a state directory of the
test's own), checked by the real CLI in a subprocess."""

import json
import os
import subprocess

import pytest
from conftest import CORRAL

from corral.audit import receipt as rc

MALFORMED = 10


@pytest.fixture
def signed(tmp_path):
    """(state dir, the receipt as a dict): a body like a run's, signed by the state
    dir's key."""
    state = str(tmp_path / "state")
    body = {"run_id": "r-test", "verdict": "ok", "exit_code": 0, "argv": ["/bin/true"],
            "usage": {"wall_s": 0.1}, "egress": {"allowed": 0, "denied": 0},
            "host": "here", "stdout_sha256": rc.sha(b"")}
    os.makedirs(os.path.join(state, "audit"), mode=0o700)
    return state, rc.sign(body, os.path.join(state, "audit"))


def verify(state: str, text: str, tmp_path) -> subprocess.CompletedProcess:
    path = tmp_path / "r.json"
    path.write_text(text)
    env = dict(os.environ, CORRAL_STATE_DIR=state)
    return subprocess.run([CORRAL, "verify", str(path)], capture_output=True, text=True,
                          env=env, timeout=60)


def _malformed(p: subprocess.CompletedProcess, *words: str) -> None:
    assert p.returncode == MALFORMED, (p.returncode, p.stderr[-2000:])
    assert p.stderr.count("\n") == 1 and "Traceback" not in p.stderr, p.stderr[-2000:]
    for w in words:
        assert w in p.stderr, p.stderr


def test_the_genuine_receipt_verifies(signed, tmp_path):
    state, r = signed
    p = verify(state, json.dumps(r), tmp_path)
    assert p.returncode == 0, p.stderr


def test_a_key_given_twice_in_the_body_is_malformed(signed, tmp_path):
    """The signed body says "ok"; a first "verdict" says "error": json.loads kept the last
    and the signature matched, so this verified while a first-wins reader saw "error"."""
    state, r = signed
    body = json.dumps(r["body"])
    text = json.dumps({**r, "body": "BODY"}).replace(
        '"BODY"', '{"verdict": "error", ' + body[1:])
    assert json.loads(text)["body"] == r["body"]      # what json.loads alone makes of it
    _malformed(verify(state, text, tmp_path), "verdict", "twice")


def test_a_key_given_twice_at_the_top_is_malformed(signed, tmp_path):
    state, r = signed
    text = '{"signature": "AAAA", ' + json.dumps(r)[1:]
    _malformed(verify(state, text, tmp_path), "signature", "twice")


@pytest.mark.parametrize("depth", [100_000, 600])
def test_deep_nesting_is_malformed(signed, tmp_path, depth):
    """100,000 levels raised RecursionError in json.loads (a traceback, exit 1); 600 parse,
    and a receipt is never more than a few levels deep."""
    state, r = signed
    deep = "[" * depth + "]" * depth
    text = json.dumps({**r, "body": {**r["body"], "extra": "DEEP"}}).replace('"DEEP"', deep)
    _malformed(verify(state, text, tmp_path), "deep")


def test_a_deep_body_signed_by_the_key_is_still_malformed(signed, tmp_path):
    """Not a forgery but a receipt corral never makes: refused before its signature is
    checked (which would serialise it again, recursively)."""
    state, r = signed
    nested: list = []
    for _ in range(200):
        nested = [nested]
    r2 = rc.sign({**r["body"], "extra": nested}, os.path.join(state, "audit"))
    _malformed(verify(state, json.dumps(r2), tmp_path), "deep")
