"""The service's token store (corral.service.tokens): hashed, 0600, atomic, no link
followed, revocation, and `corral token`'s output."""

import os
import stat
import subprocess

import pytest
from conftest import CORRAL

from corral.errors import UsageError
from corral.service.tokens import TokenStore, digest


def test_create_verify_revoke(tmp_path):
    s = TokenStore(str(tmp_path))
    tok = s.create("a", max_sandboxes=3)
    assert tok.startswith("corral_") and len(tok) > 40
    t = s.verify(tok)
    assert t.name == "a" and t.max_sandboxes == 3
    assert s.verify(tok[:-1] + ("A" if tok[-1] != "A" else "B")) is None
    assert s.verify("not-a-token") is None
    with open(s.path) as f:
        raw = f.read()
    assert tok not in raw and digest(tok) in raw
    assert stat.S_IMODE(os.stat(s.path).st_mode) == 0o600
    with pytest.raises(UsageError):
        s.create("a")                     # a live name is not replaced
    s.revoke("a")
    assert s.verify(tok) is None
    tok2 = s.create("a")                  # a revoked name may be used again
    assert s.verify(tok2).name == "a" and s.verify(tok) is None
    # ... by another token: what it owns is keyed by its own id, never the old one's
    old_owner = t.owner
    assert s.verify(tok2).owner != old_owner and s.verify(tok2).owner.startswith("a/")


def test_a_record_without_an_id_takes_one_from_its_hash(tmp_path):
    from corral.service.tokens import Token

    t = Token({"name": "old", "sha256": "ab" * 32})
    assert t.id == "ab" * 8 and t.owner == "old/" + "ab" * 8


def test_a_revocation_by_another_store_counts_at_the_next_verify(tmp_path):
    """The service's store keeps what it read while the file is unchanged; `corral token
    revoke` (another process: another store) replaces the file, seen at once."""
    served, cli = TokenStore(str(tmp_path)), TokenStore(str(tmp_path))
    tok = cli.create("a")
    assert served.verify(tok).name == "a"
    assert served.verify(tok).name == "a"          # from what it kept
    cli.revoke("a")
    assert served.verify(tok) is None
    tok2 = cli.create("a")
    assert served.verify(tok2).name == "a" and served.verify(tok) is None


def test_a_link_in_place_of_the_file_is_refused_not_followed(tmp_path):
    s = TokenStore(str(tmp_path))
    s.create("a")
    victim = tmp_path / "victim"
    victim.write_text("untouched")
    os.unlink(s.path)
    os.symlink(victim, s.path)
    with pytest.raises(UsageError):
        s.load()
    with pytest.raises(UsageError):
        s.create("b")
    assert victim.read_text() == "untouched"


def test_a_link_as_the_service_dir_is_refused(tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (tmp_path / "state").mkdir()
    os.symlink(elsewhere, tmp_path / "state" / "service")
    with pytest.raises(UsageError):
        TokenStore(str(tmp_path / "state")).create("a")
    assert os.listdir(elsewhere) == []


def test_bad_names_and_limits(tmp_path):
    s = TokenStore(str(tmp_path))
    for name in ("", "a b", "../x", "x" * 64):
        with pytest.raises(UsageError):
            s.create(name)
    with pytest.raises(UsageError):
        s.create("a", max_concurrent=0)


def test_the_cli_prints_the_token_once_on_the_last_line(tmp_path):
    state = str(tmp_path)
    out = subprocess.run([CORRAL, "token", "create", "--name", "x", "--state-dir", state],
                         capture_output=True, text=True, check=True)
    tok = out.stdout.splitlines()[-1]
    assert out.stdout == tok + "\n" and tok not in out.stderr
    assert TokenStore(state).verify(tok).name == "x"
    ls = subprocess.run([CORRAL, "token", "ls", "--state-dir", state], capture_output=True,
                        text=True, check=True).stdout
    assert ls.startswith("x\tlive") and tok not in ls
    bad = subprocess.run([CORRAL, "token", "revoke", "nobody", "--state-dir", state],
                         capture_output=True, text=True)
    assert bad.returncode == 2 and "no live token" in bad.stderr
    ceiling = tmp_path / "c.toml"
    ceiling.write_text('[limits]\nmemory = "lots"\n')
    bad = subprocess.run([CORRAL, "token", "create", "--name", "y", "--ceiling", str(ceiling),
                          "--state-dir", state], capture_output=True, text=True)
    assert bad.returncode == 2 and "limits.memory" in bad.stderr and bad.stdout == ""
    # a ceiling file that is missing or no TOML: named as --ceiling (it said --policy)
    for path in (str(tmp_path / "missing.toml"), "/etc/passwd"):
        bad = subprocess.run([CORRAL, "token", "create", "--name", "z", "--ceiling", path,
                              "--state-dir", state], capture_output=True, text=True)
        assert bad.returncode == 2 and bad.stdout == "", bad.stderr
        assert bad.stderr.startswith("corral token: --ceiling: ") and "--policy" not in \
            bad.stderr, bad.stderr


def test_apply_changes_is_off_unless_asked_and_the_cli_sets_it(tmp_path):
    s = TokenStore(str(tmp_path))
    assert s.verify(s.create("agent")).apply_changes is False
    assert s.verify(s.create("person", apply_changes=True)).apply_changes is True
    out = subprocess.run([CORRAL, "token", "create", "--name", "rev", "--apply-changes",
                          "--state-dir", str(tmp_path)], capture_output=True, text=True,
                         check=True)
    assert s.verify(out.stdout.splitlines()[-1]).apply_changes is True
    ls = subprocess.run([CORRAL, "token", "ls", "--state-dir", str(tmp_path)],
                        capture_output=True, text=True, check=True).stdout
    lines = {ln.split("\t")[0]: ln for ln in ls.splitlines()}
    assert "apply-changes" in lines["rev"] and "apply-changes" not in lines["agent"]
