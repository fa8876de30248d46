"""Start-up side by side: corral's three tiers, the raw tools and the peers, in one run.

    .venv/bin/python bench/compare.py [--quick] [--runs N] [--json FILE] [--no-peers]

`/bin/true` and `/usr/bin/python3 -c pass`, each sample the wall time from the call to the
finished result (teardown included). Contenders (bench/README.md):

  floors    bare (fork+exec), bwrap (corral's exact argv and seccomp, bench/startup.py),
            runsc (`runsc --network=none --platform=ptrace do`)
  corral    for each tier (namespace, gvisor, process): corral.run (fresh Sandbox),
            sb.exec (one open Sandbox), cli (`.venv/bin/corral run --isolation T --`)
  peers     srt (Anthropic sandbox-runtime), codex sandbox through its npm launcher (node)
            and through the native binary the package ships (bench/peers.py)

Before timing, every contender runs a probe (write to its scratch, write to /etc, TCP
connect to a listener on the host's 127.0.0.1) so the table only compares sandboxes that
actually deny what corral's default policy denies. Round robin as startup.py: every
contender once per round in a fresh shuffled order (seeded), the first WARMUP rounds
discarded.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time

import peers as peers_mod
import startup
from startup import COMMANDS, VariantFailed, check_result, percentile, round_orders, run_checked

WARMUP = 2
TIERS = ("namespace", "gvisor", "process")
PROBE = r"""
import json, os, socket, sys
scratch, port = sys.argv[1], int(sys.argv[2])
r = {}
try:
    with open(os.path.join(scratch, "corral-bench-probe"), "w") as f:
        f.write("x")
    r["scratch_write"] = "ok"
except OSError as e:
    r["scratch_write"] = f"refused: {e.strerror}"
try:
    with open("/etc/corral-bench-probe", "w") as f:
        f.write("x")
    r["etc_write"] = "ok"
except OSError as e:
    r["etc_write"] = f"refused: {e.strerror}"
try:
    socket.create_connection(("127.0.0.1", port), timeout=2).close()
    r["host_tcp"] = "connected"
except OSError as e:
    r["host_tcp"] = f"refused: {e.strerror or e}"
print(json.dumps(r))
"""
EXPECT = {"scratch_write": "ok", "etc_write": "refused", "host_tcp": "refused"}


class Contenders:
    def __init__(self, use_peers: bool, use_runsc: bool, log) -> None:
        import corral

        self.corral = corral
        self.base = startup.Bench(use_runsc=use_runsc)   # bare, bwrap, runsc, the cli path
        self.errors: dict[str, str] = {}
        self.meta: dict[str, dict] = {}
        self.open: dict[str, object] = {"namespace": self.base.sb}
        for tier in TIERS[1:]:
            try:
                sb = corral.Sandbox({"isolation": tier})
                sb.open()
                self.open[tier] = sb
            except Exception as e:  # noqa: BLE001 - a tier this host lacks is a result
                self.errors[f"{tier}"] = f"{type(e).__name__}: {e}"
        self.scratch = tempfile.mkdtemp(prefix="corral-bench-peer-scratch-")
        os.chmod(self.scratch, 0o755)
        self.peers: dict[str, dict] = {}
        if use_peers:
            err = peers_mod.install(log)
            if err:
                for p in ("srt", "codex-npm", "codex-native"):
                    self.errors[p] = err
            else:
                self.peers, perr = peers_mod.configure(self.scratch)
                self.errors.update(perr)
        else:
            for p in ("srt", "codex-npm", "codex-native"):
                self.errors[p] = "skipped (--no-peers)"

    def close(self) -> None:
        for tier, sb in self.open.items():
            if tier != "namespace":
                sb.close()
        self.base.close()
        shutil.rmtree(self.scratch, ignore_errors=True)

    def funcs(self) -> dict:
        """{contender: (group, fn(argv))}, in table order."""
        b = self.base
        f: dict = {"bare": ("floor", b.bare), "bwrap": ("floor", b.bwrap)}
        if b.runsc:
            f["runsc"] = ("floor", b.runsc_do)
        else:
            self.errors.setdefault("runsc", "runsc not installed")
        for tier in TIERS:
            if tier in self.errors:
                for v in ("corral.run", "sb.exec", "cli"):
                    self.errors[f"{v} {tier}"] = self.errors[tier]
                continue
            pol = {"isolation": tier}
            sb = self.open[tier]
            f[f"corral.run {tier}"] = (tier, lambda a, pol=pol: check_result(
                self.corral.run(a, policy=pol)))
            f[f"sb.exec {tier}"] = (tier, lambda a, sb=sb: check_result(sb.exec(a)))
            f[f"cli {tier}"] = (tier, lambda a, t=tier: run_checked(
                [b.cli, "run", "--isolation", t, "--", *a], timeout=60))
        for name, spec in self.peers.items():
            f[name] = ("peer", lambda a, s=spec: run_checked(
                s["argv_prefix"] + a, env=s["env"], cwd=s["cwd"], timeout=60))
        return f

    # -- the probe: does each contender deny what corral's default policy denies? -------
    def probe(self, funcs: dict) -> dict:
        srv = socket.socket()
        srv.bind(("127.0.0.1", 0))
        srv.listen(16)
        port = srv.getsockname()[1]
        out: dict[str, dict] = {}
        try:
            for name in funcs:
                if name in ("bare", "bwrap", "runsc"):
                    continue
                scratch = self.scratch if name in self.peers else "/scratch"
                if name.endswith(" process"):
                    scratch = None  # the process tier's scratch is $HOME, a host directory
                argv = ["/usr/bin/python3", "-c", PROBE, scratch or "$HOME", str(port)]
                try:
                    out[name] = self._probe_one(name, argv)
                except Exception as e:  # noqa: BLE001
                    out[name] = {"error": f"{type(e).__name__}: {e}"}
        finally:
            srv.close()
        return out

    def _probe_one(self, name: str, argv: list[str]) -> dict:
        if name.endswith(" process"):  # no /scratch path there: ask the shell for $HOME
            argv = ["/bin/sh", "-c", 'exec /usr/bin/python3 -c "$0" "$HOME" "$1"', argv[2],
                    argv[4]]
        if name.startswith(("corral.run", "sb.exec")):
            tier = name.split()[1]
            r = (self.corral.run(argv, policy={"isolation": tier}) if name.startswith(
                "corral.run") else self.open[tier].exec(argv))
            text = r.stdout
        elif name.startswith("cli "):
            p = subprocess.run(check=False, args=[self.base.cli, "run", "--isolation", name.split()[1], "--",
                                *argv], capture_output=True, text=True, timeout=60)
            text = p.stdout
        else:
            s = self.peers[name]
            p = subprocess.run(check=False, args=s["argv_prefix"] + argv, env=s["env"], cwd=s["cwd"],
                               capture_output=True, text=True, timeout=60)
            text = p.stdout
        lines = [ln for ln in text.splitlines() if ln.startswith("{")]
        if not lines:
            return {"error": f"no probe output: {text[-300:]!r}"}
        r = json.loads(lines[-1])
        r["as_corral_default"] = all(r.get(k, "").startswith(v) for k, v in EXPECT.items())
        return r


def summarize(samples: dict[str, list[float]]) -> dict:
    out = {}
    for key, xs in samples.items():
        if xs:
            out[key] = {"n": len(xs), "median_ms": statistics.median(xs),
                        "p95_ms": percentile(xs, 0.95), "min_ms": min(xs)}
    for key, s in out.items():
        c = key.rsplit(" ", 1)[1]
        base = out.get(f"bwrap {c}", {}).get("median_ms")
        s["ratio_to_bwrap"] = s["median_ms"] / base if base else None
        s["p95_ratio_to_bwrap"] = s["p95_ms"] / out[f"bwrap {c}"]["p95_ms"] if base else None
    return out


def goals(summary: dict, peer_names: list[str]) -> list[dict]:
    g = []
    for c in COMMANDS:
        base = summary.get(f"bwrap {c}", {}).get("median_ms")
        if base is None:
            continue
        for v in ("corral.run namespace", "sb.exec namespace"):
            s = summary.get(f"{v} {c}")
            if s:
                g.append({"goal": f"{v} <= {startup.GOAL_INPROC_RATIO}x raw bwrap",
                          "command": c, "value_ms": s["median_ms"],
                          "limit_ms": startup.GOAL_INPROC_RATIO * base,
                          "met": s["median_ms"] <= startup.GOAL_INPROC_RATIO * base})
        s = summary.get(f"cli namespace {c}")
        if s:
            lim = base + startup.GOAL_CLI_EXTRA_MS
            g.append({"goal": f"cli namespace <= raw bwrap + {startup.GOAL_CLI_EXTRA_MS:g} ms",
                      "command": c, "value_ms": s["median_ms"], "limit_ms": lim,
                      "met": s["median_ms"] <= lim})
            fastest = [(summary[f"{p} {c}"]["median_ms"], p) for p in peer_names
                       if f"{p} {c}" in summary]
            if fastest:
                ms, who = min(fastest)
                g.append({"goal": "cli namespace faster than every peer's fastest path",
                          "command": c, "value_ms": s["median_ms"], "limit_ms": ms,
                          "fastest_peer": who, "met": s["median_ms"] < ms})
    return g


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, help="measured runs per contender and command "
                    "(default 30, --quick 5); 2 warm-up rounds more are discarded")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--json", metavar="FILE")
    ap.add_argument("--no-peers", action="store_true")
    ap.add_argument("--no-runsc", action="store_true", help="leave gVisor out (floor and tier)")
    ap.add_argument("--seed", type=int, default=1, help="of the per-round shuffle (default 1)")
    args = ap.parse_args()
    runs = args.runs or (5 if args.quick else 30)
    warmup = 1 if args.quick else WARMUP

    info = startup.machine()
    log = lambda m: print(m, file=sys.stderr, flush=True)
    c = Contenders(use_peers=not args.no_peers, use_runsc=not args.no_runsc, log=log)
    if args.no_runsc:
        c.errors["gvisor"] = "skipped (--no-runsc)"
    try:
        funcs = c.funcs()
        info["peers"] = {n: s["version"] for n, s in c.peers.items()}
        info["node"] = peers_mod._out(["node", "--version"]) if shutil.which("node") else "-"
        print("machine:")
        for k, v in info.items():
            print(f"  {k:7} {v}")
        probes = c.probe(funcs)
        for name, r in probes.items():
            print(f"  probe {name:22} {r}")
        units = [(v, cmd) for v in funcs for cmd in COMMANDS]
        samples: dict[str, list[float]] = {f"{v} {cmd}": [] for v, cmd in units}
        dropped: dict[str, str] = {}
        t0 = time.monotonic()
        for rnd, order in enumerate(round_orders(units, warmup + runs, args.seed)):
            for v, cmd in order:
                if v in dropped:
                    continue
                try:
                    start = time.perf_counter_ns()
                    funcs[v][1](COMMANDS[cmd])
                    ms = (time.perf_counter_ns() - start) / 1e6
                except (VariantFailed, OSError, subprocess.SubprocessError) as e:
                    dropped[v] = f"{v} {cmd}, round {rnd}: {type(e).__name__}: {e}"
                    log(f"  {v} failed and is dropped: {dropped[v]}")
                    continue
                if rnd >= warmup:
                    samples[f"{v} {cmd}"].append(ms)
            log(f"  round {rnd + 1}/{warmup + runs} ({time.monotonic() - t0:.0f}s)")
    finally:
        c.close()

    for v in dropped:
        for cmd in COMMANDS:
            samples.pop(f"{v} {cmd}", None)
    summary = summarize(samples)
    peer_names = [p for p in c.peers if p not in dropped]
    gl = goals(summary, peer_names)
    errors = {**c.errors, **dropped}

    print(f"\n{runs} runs per contender after {warmup} warm-up rounds, round robin in a "
          f"shuffled order (seed {args.seed}); ms from the call to the result, teardown "
          "included")
    for cmd, argv in COMMANDS.items():
        print(f"\n{' '.join(argv)}")
        print(f"  {'contender':22} {'median':>8} {'p95':>8} {'min':>8} {'x bwrap':>8}")
        for v in funcs:
            s = summary.get(f"{v} {cmd}")
            if s:
                r = s["ratio_to_bwrap"]
                print(f"  {v:22} {s['median_ms']:8.2f} {s['p95_ms']:8.2f} {s['min_ms']:8.2f} "
                      f"{r:8.2f}" if r else "")
    print("\ngoals:")
    for g in gl:
        print(f"  {g['command']:8} {g['goal']}: {g['value_ms']:.2f} vs {g['limit_ms']:.2f} ms"
              f"  {'MET' if g['met'] else 'NOT MET'}")
    if errors:
        print("\nnot measured:")
        for k, e in errors.items():
            print(f"  {k}: {e}")
    if args.json:
        out = {"machine": info, "runs": runs, "warmup": warmup, "seed": args.seed,
               "commands": COMMANDS,
               "contenders": [{"name": v, "group": funcs[v][0]} for v in funcs],
               "bwrap_argv": c.base.bwrap_prefix + ["--", "CMD..."],
               "runsc_argv": ["runsc", "--network=none", "--platform=ptrace", "do", "CMD..."],
               "cli_argv": [c.base.cli, "run", "--isolation", "TIER", "--", "CMD..."],
               "peers": {n: peers_mod.public(s) for n, s in c.peers.items()},
               "probes": probes, "errors": errors, "summary": summary, "goals": gl,
               "samples_ms": samples}
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
        print(f"\nwritten to {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
