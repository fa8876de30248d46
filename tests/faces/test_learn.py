"""Learn mode (docs/audit.md, "Learn mode"; runtime/learn.py, audit/cli_learn.py): `corral
learn` runs a command permissively through the real egress proxy, resolving test names
with a real dnsmasq to real HTTP servers on a loopback /24 of this run's own, and writes a
policy that `corral run --policy` then loads. Every address is on 127.0.0.0/8."""

from __future__ import annotations

import concurrent.futures
import json
import os
import subprocess
import tomllib

import pytest
from conftest import CORRAL, PY, tier_unavailable
from netfix import PRIV, SRV, start_dnsmasq

import corral
from corral.plan import EgressProxy, build_plan
from corral.policy import policy_from_dict

TIER = "namespace"


@pytest.fixture(autouse=True, scope="module")
def _tier():
    why = tier_unavailable(TIER, {"network": {"mode": "allow", "allow": ["x.test"]}})
    if why:
        pytest.skip(f"{TIER}: {why}")


@pytest.fixture(scope="module")
def dns(tmp_path_factory):
    log = tmp_path_factory.mktemp("learn-dns") / "dnsmasq.log"
    proc, port = start_dnsmasq({"one.test": SRV, "two.test": SRV, "three.test": SRV}, log)
    yield port
    proc.terminate()
    proc.wait(timeout=10)


def learn(tmp_path, *args, check=True):
    env = dict(os.environ, CORRAL_STATE_DIR=str(tmp_path / "state"))
    p = subprocess.run([CORRAL, "learn", "--isolation", TIER, "--json", *args],
                       capture_output=True, text=True, env=env, timeout=120)
    out = json.loads(p.stdout) if p.stdout.strip() else None
    if check:
        assert p.returncode == 0, (p.returncode, p.stderr)
    return p, out


def run(tmp_path, policy_file, cmd):
    env = dict(os.environ, CORRAL_STATE_DIR=str(tmp_path / "state"))
    p = subprocess.run([CORRAL, "run", "--policy", str(policy_file), "--json", "--", *cmd],
                       capture_output=True, text=True, env=env, timeout=120)
    assert p.stdout.strip(), p.stderr
    return p, json.loads(p.stdout)


def fetch(*hosts: str, write: str | None = None) -> list[str]:
    """A shell command that fetches each host's page (failing on a refusal) and writes one
    file in the workspace."""
    parts = [f"curl -sSf -m 10 http://{h}/ -o /dev/null" for h in hosts]
    if write:
        parts.append(f"echo learned > {write}")
    return ["/bin/sh", "-c", " && ".join(parts)]


def test_learn_then_run_the_learned_policy_and_a_wider_variation_is_refused(
        tmp_path, dns, servers):
    ws = tmp_path / "ws"
    ws.mkdir()
    out = tmp_path / "learned.toml"
    net = ["--nameserver", f"127.0.0.1:{dns}", "--allow-private", PRIV]
    cmd = fetch("one.test", "two.test", write="/workspace/out.txt")
    p, j = learn(tmp_path, *net, "--workspace", f"{ws}:rw", "--out", str(out), "--", *cmd)
    assert j["result"]["verdict"] == "ok", j["result"]
    assert [(h["host"], h["port"]) for h in j["observed"]["hosts"]] == [
        ("one.test", 80), ("two.test", 80)], j["observed"]
    assert j["observed"]["workspace_changes"] == [{"kind": "added", "path": "out.txt"}]
    assert not (ws / "out.txt").exists()        # the learn run never writes the host's
    text = out.read_text()
    assert text == j["policy"]
    pol = tomllib.loads(text)
    assert pol["network"]["mode"] == "allow"
    assert pol["network"]["allow"] == ["one.test:80", "two.test:80"]
    assert pol["filesystem"]["workspace"] == {"path": str(ws), "mode": "rw"}
    # each rule says which observation produced it
    for rule in ('"one.test:80",', '"two.test:80",'):
        line = next(ln for ln in text.splitlines() if rule in ln)
        assert "# 1 connection(s)" in line and "bytes in" in line, line
    assert "# the command wrote 1 path(s) in the workspace (first: out.txt)" in text

    # the same command under the learned policy succeeds, and writes for real this time
    p, r = run(tmp_path, out, cmd)
    assert r["verdict"] == "ok" and p.returncode == 0, (r, p.stderr)
    assert (ws / "out.txt").read_text() == "learned\n"
    # one more domain: refused by the proxy, named in its reason
    p, r = run(tmp_path, out, fetch("one.test", "two.test", "three.test"))
    assert r["verdict"] == "error" and r["exit_code"] == 22, r   # curl -f: the 403
    denied = [e for e in r["events"] if e["kind"] == "net" and e["decision"] == "deny"]
    assert [(e["host"], e["port"]) for e in denied] == [("three.test", 80)], r["events"]
    assert "not in network.allow" in denied[0]["reason"]


def test_learned_limits_carry_the_margin(tmp_path):
    cmd = [PY, "-c", "b = bytearray(96 << 20); b[::4096] = b'x' * len(b[::4096]); "
                     "import time; t = time.process_time()\n"
                     "while time.process_time() - t < 4: pass"]
    def one(margin):       # each a state dir of its own; the two run at once (4 s of CPU each)
        flags = () if margin == 1.5 else ("--margin", str(margin))
        (tmp_path / str(margin)).mkdir()
        return margin, learn(tmp_path / str(margin), *flags, "--", *cmd)[1]

    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        done = list(pool.map(one, (1.5, 2.5)))
    for margin, j in done:
        obs = j["observed"]
        assert j["margin"] == margin and obs["memory_peak_bytes"] > 96 << 20, obs
        lim = tomllib.loads(j["policy"])["limits"]
        pol = policy_from_dict({"limits": lim}).limits
        mib = 1 << 20
        assert pol.memory == -(-int(obs["memory_peak_bytes"] * margin) // mib) * mib, (pol, obs)
        assert pol.cpu_time == max(-(-obs["cpu_s"] * margin // 1), 5), (pol, obs)
        assert pol.cpu_time >= 4 * margin
        assert pol.timeout == max(-(-obs["wall_s"] * margin // 1), 5), (pol, obs)
        assert f"x {margin:g}" in j["policy"]


def test_private_and_metadata_addresses_are_refused_in_learn_mode(tmp_path, dns, servers):
    """No allow_private given: the name one.test resolves to loopback and is refused after
    the lookup; the metadata name and address are refused too; nothing is learned."""
    cmd = ["/bin/sh", "-c",
           "for u in http://one.test/ http://169.254.169.254/latest/meta-data/ "
           f"http://metadata.google.internal/ http://{SRV}/; do "
           "curl -s -m 10 -o /dev/null -w '%{http_code}\\n' $u; done"]
    p, j = learn(tmp_path, "--nameserver", f"127.0.0.1:{dns}", "--", *cmd)
    assert j["result"]["stdout"].split() == ["403"] * 4, j["result"]
    refused = {(h["host"], h["port"]): h["reason"] for h in j["observed"]["refused"]}
    assert set(refused) == {("one.test", 80), ("169.254.169.254", 80),
                            ("metadata.google.internal", 80), (SRV, 80)}, refused
    assert "loopback" in refused[("one.test", 80)]
    assert "metadata" in refused[("169.254.169.254", 80)]
    assert refused[("metadata.google.internal", 80)] == "metadata name"
    assert j["observed"]["hosts"] == []
    pol = tomllib.loads(j["policy"])
    assert pol["network"] == {"mode": "none"}
    assert "refused in the learn run too, not allowed here: one.test:80" in j["policy"]


def test_nothing_contacted_keeps_the_network_closed_and_the_human_summary(tmp_path):
    env = dict(os.environ, CORRAL_STATE_DIR=str(tmp_path / "state"))
    out = tmp_path / "p.toml"
    p = subprocess.run([CORRAL, "learn", "--isolation", TIER, "--out", str(out), "--",
                        "/bin/echo", "hello"], capture_output=True, text=True, env=env,
                       timeout=120)
    assert p.returncode == 0 and p.stdout == "hello\n", (p.stdout, p.stderr)
    assert "no network connection: the policy keeps the network closed" in p.stderr
    assert f"policy written to {out}" in p.stderr
    pol = tomllib.loads(out.read_text())
    assert pol["network"] == {"mode": "none"} and "filesystem" not in pol
    assert corral.load_policy(str(out)).network.mode == "none"


def test_learn_refuses_host_secrets_and_flags_it_cannot_honour(tmp_path):
    env = dict(os.environ, CORRAL_STATE_DIR=str(tmp_path / "state"), SOME_TOKEN="x" * 20)
    for flags, field in ((["--env", "SOME_TOKEN"], "env.pass"),
                         (["--secret", "T=env:SOME_TOKEN@example.com"], "secrets"),
                         (["--receipt", str(tmp_path / "r.json")], "--receipt"),
                         (["--margin", "0.5"], "--margin")):
        p = subprocess.run([CORRAL, "learn", *flags, "--", "/bin/true"], capture_output=True,
                           text=True, env=env, timeout=60)
        assert p.returncode == 2 and field in p.stderr, (flags, p.returncode, p.stderr)
        assert len(p.stderr.strip().splitlines()) == 1, p.stderr


def test_the_api_learns_across_commands_of_a_live_sandbox(dns, servers):
    pol = {"isolation": TIER, "network": {"nameservers": [f"127.0.0.1:{dns}"],
                                          "allow_private": [PRIV]}}
    sb = corral.Sandbox.create(pol, learn=True, timeout=120)
    try:
        for host in ("one.test", "two.test"):
            r = sb.commands.run(fetch(host))
            assert r.exit_code == 0, r
        seen = sb.learned()
        text = sb.learned_policy(margin=2)
    finally:
        sb.kill()
    assert [(h["host"], h["port"]) for h in seen["hosts"]] == [("one.test", 80),
                                                                 ("two.test", 80)]
    assert seen["commands"] == 2
    assert tomllib.loads(text)["network"]["allow"] == ["one.test:80", "two.test:80"]
    with pytest.raises(corral.UsageError):
        corral.Sandbox.create(pol, learn=True, detached=True)


def test_learn_mode_is_not_reachable_from_a_policy():
    with pytest.raises(corral.PolicyError):
        policy_from_dict({"network": {"mode": "allow", "learn": True}})
    pol = policy_from_dict({"network": {"mode": "allow"}})
    (proxy,) = build_plan(pol, {}).find(EgressProxy)
    assert "learn" not in json.loads(proxy.config_json)
    (proxy,) = build_plan(pol, {}, learn=True).find(EgressProxy)
    assert json.loads(proxy.config_json)["learn"] is True


def test_the_proxy_decisions_in_learn_mode():
    """Pure: learn lets any well-formed host at any port past the name check; deny rules,
    metadata names and the address guard still refuse; the wire contract round-trips."""
    from ipaddress import ip_address

    from corral.egress.config import NetConfig
    from corral.egress.decide import LEARN_REASON, check_address, decide_target

    cfg = NetConfig.from_dict({"deny": ["bad.example"], "learn": True})
    assert NetConfig.from_json(cfg.to_json()) == cfg
    assert "learn" not in NetConfig.from_dict({}).to_dict()
    for host, port in (("pypi.org", 443), ("a.b.example.com", 22), ("93.184.215.14", 8080)):
        d = decide_target(cfg, host, port)
        assert d.allow and d.reason == LEARN_REASON, (host, d)
    assert not decide_target(cfg, "bad.example", 443).allow
    assert decide_target(cfg, "metadata.google.internal", 80).reason == "metadata name"
    assert not decide_target(NetConfig(), "pypi.org", 443).allow
    for addr in ("127.0.0.1", "10.1.2.3", "169.254.169.254", "::1", "fd00::1"):
        assert not check_address(cfg, ip_address(addr), 80).allow, addr
    assert check_address(cfg, ip_address("93.184.215.14"), 80).allow
    with pytest.raises(corral.PolicyError):
        NetConfig.from_dict({"learn": "yes"})


def test_the_learned_policy_is_valid_toml_for_awkward_input(tmp_path):
    """Pure: what the sandbox reported (a hostile file name, refusal reasons with control
    characters), an IPv6 literal, a workspace path with quotes and non-ASCII: the policy
    loads, and nothing of the sandbox's text escapes its comment line."""
    from corral.result import Result, Usage
    from corral.runtime.changes import Change
    from corral.runtime.learn import Learner

    ws = tmp_path / 'pro"j ü'
    ws.mkdir()
    asked = policy_from_dict({"filesystem": {"workspace": {"path": str(ws), "mode": "rw"}}})
    lr = Learner(asked)
    lr.add(Result("ok", 0, None, usage=Usage(wall_s=2.2, cpu_s=0.5, memory_peak_bytes=50 << 20),
                  events=[{"kind": "net", "host": "2001:db8::1", "port": 8443,
                           "decision": "allow", "reason": "learn", "bytes_in": 1,
                           "bytes_out": 2},
                          {"kind": "net", "host": "x.test", "port": 80, "decision": "deny",
                           "reason": "evil\nmode = \"none\"\n[limits]", "bytes_in": 0,
                           "bytes_out": 0}]))
    lr.add_changes([Change(path="a\nallow = [\"*\"]", kind="added", type="file")])
    text = lr.policy_toml(1.5)
    pol = tomllib.loads(text)
    assert pol["network"]["allow"] == ["[2001:db8::1]:8443"]
    assert pol["filesystem"]["workspace"] == {"path": str(ws), "mode": "rw"}
    assert pol["limits"] == {"memory": "75M", "timeout": "5s", "cpu_time": "5s"}
    assert set(pol) == {"isolation", "limits", "network", "filesystem"}
    with pytest.raises(corral.PolicyError):
        lr.policy_toml(0.5)
