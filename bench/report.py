"""docs/benchmarks.md and docs/benchmarks-startup.png from bench/out/*.json.

    bench/.venv/bin/python bench/report.py     # bench/all.py runs this after the sections

Only reads the JSON the sections wrote (and bench/out/run.json, the run's metadata);
a section without JSON is listed as not run. The plot uses matplotlib's Agg backend.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
OUT = os.path.join(HERE, "out")
DOC = os.path.join(ROOT, "docs", "benchmarks.md")
PNG = os.path.join(ROOT, "docs", "benchmarks-startup.png")
MB = 1024 * 1024

GROUP_COLORS = {"floor": "#7f7f7f", "namespace": "#1f77b4", "gvisor": "#9467bd",
                "process": "#2ca02c", "peer": "#d62728"}
WHAT = {
    "bare": "fork+exec of the command itself, no sandbox",
    "bwrap": "raw bubblewrap with corral's exact argv, seccomp program, uid and environment "
             "(the ratio's baseline), started with `subprocess.run` (a fork+exec; corral "
             "starts bwrap as a vfork, docs/tiers.md, which saves ~0.7 ms of page-table "
             "copying per run here: why `sb.exec` can come in under 1.0x)",
    "runsc": "`runsc --network=none --platform=ptrace do` (gVisor's own one-shot path)",
    "corral.run": "`corral.run(cmd)`: a fresh Sandbox per run, teardown included",
    "sb.exec": "`Sandbox.exec(cmd)` on one Sandbox kept open",
    "cli": "`.venv/bin/corral run --isolation T -- cmd`: interpreter start and imports "
           "included",
    "srt": "Anthropic sandbox-runtime's `srt` CLI (node)",
    "codex-npm": "`codex sandbox` through the npm launcher `bin/codex.js` (node, then the "
                 "native binary)",
    "codex-native": "`codex sandbox` with the native binary from the package's vendor/ "
                    "directory",
}


def load(name: str) -> dict | None:
    p = os.path.join(OUT, f"{name}.json")
    if not os.path.exists(p):
        return None
    with open(p) as f:
        return json.load(f)


def sh(argv: list[str]) -> str:
    try:
        return subprocess.run(argv, check=False, capture_output=True, text=True).stdout.strip()
    except OSError:
        return "unavailable"


def f2(x: float | None, nd: int = 2) -> str:
    return "-" if x is None else f"{x:.{nd}f}"


def met(b: bool | None) -> str:
    return "-" if b is None else ("**met**" if b else "**not met**")


def table(head: list[str], rows: list[list[str]], align: str | None = None) -> list[str]:
    align = align or "l" + "r" * (len(head) - 1)
    sep = ["---:" if a == "r" else "---" for a in align]
    return ["| " + " | ".join(head) + " |", "| " + " | ".join(sep) + " |"] + [
        "| " + " | ".join(r) + " |" for r in rows]


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown"


# -- the plot ------------------------------------------------------------------------------
def plot(st: dict) -> bool:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cmds = list(st["commands"])
    names = [c["name"] for c in st["contenders"]]
    groups = {c["name"]: c["group"] for c in st["contenders"]}
    fig, axes = plt.subplots(1, len(cmds), figsize=(13, 0.42 * len(names) + 1.6), sharey=True)
    if len(cmds) == 1:
        axes = [axes]
    for ax, cmd in zip(axes, cmds):
        ys, med, p95, col = [], [], [], []
        for i, n in enumerate(names):
            s = st["summary"].get(f"{n} {cmd}")
            if not s:
                continue
            ys.append(i)
            med.append(s["median_ms"])
            p95.append(s["p95_ms"] - s["median_ms"])
            col.append(GROUP_COLORS.get(groups[n], "#333333"))
        ax.barh(ys, med, xerr=[[0] * len(p95), p95], color=col, capsize=2,
                error_kw={"elinewidth": 0.8})
        base = st["summary"].get(f"bwrap {cmd}", {}).get("median_ms")
        if base:
            ax.axvline(base, color="#444444", lw=0.8, ls="--")
        for y, m, e in zip(ys, med, p95):
            label = f"{m:.1f} ms" + (f"  ({m / base:.1f}x)" if base else "")
            ax.text((m + e) * 1.1, y, label, va="center", fontsize=7.5)
        ax.set_xscale("log")
        ax.set_xlim(left=0.5, right=max(med) * 6)
        ax.set_title(" ".join(st["commands"][cmd]), fontsize=10)
        ax.set_xlabel("ms from the call to the result (median; whisker to p95; log scale; "
                      "dashed: raw bwrap)", fontsize=8)
        ax.grid(axis="x", which="both", alpha=0.2)
    axes[0].set_yticks(range(len(names)))
    axes[0].set_yticklabels(names, fontsize=8.5)
    axes[0].invert_yaxis()
    from matplotlib.patches import Patch

    fig.legend(handles=[Patch(color=c, label=g) for g, c in GROUP_COLORS.items()],
               loc="lower center", ncol=len(GROUP_COLORS), fontsize=8, frameon=False)
    fig.suptitle(f"Start-up latency, {st['runs']} runs each, round robin, shuffled "
                 f"({st['machine']['nproc']} CPUs, {st['machine']['cpu']})", fontsize=10)
    fig.tight_layout(rect=(0, 0.05, 1, 0.97))
    fig.savefig(PNG, dpi=110)
    plt.close(fig)
    return True


# -- sections ------------------------------------------------------------------------------
def startup_section(st: dict, goals: list) -> list[str]:
    L = ["## 1. Start-up", ""]
    st["machine"]
    L += [(f"{st['runs']} measured runs per contender and command after {st['warmup']} "
          "warm-up round(s), round robin (every contender once per round, in an order "
          f"shuffled afresh each round, seed {st.get('seed', '-')}: no contender always "
          "follows the same one); ms from the call to the finished result, teardown included. "
          "Ratios are to raw bwrap's median (p95 ratio: to raw bwrap's p95)."), "",
          "![start-up latency per tier and peer](benchmarks-startup.png)", ""]
    names = [c["name"] for c in st["contenders"]]
    for cmd, argv in st["commands"].items():
        L += [f"`{' '.join(argv)}`", ""]
        rows = []
        for n in names:
            s = st["summary"].get(f"{n} {cmd}")
            if not s:
                rows.append([n, "not measured", "", "", "", ""])
                continue
            rows.append([n, f2(s["median_ms"]), f2(s["p95_ms"]), f2(s["min_ms"]),
                         f2(s["ratio_to_bwrap"]) + "x", f2(s.get("p95_ratio_to_bwrap")) + "x"])
        L += table(["contender", "median ms", "p95 ms", "min ms", "median / bwrap",
                    "p95 / bwrap"], rows) + [""]
    # an in-process start-up goal not met: say what the gap is made of
    missed = [g for g in st["goals"] if not g["met"] and g["goal"].startswith("corral.run")]
    if missed:
        L += ["**Why `corral.run` misses the 1.3x goal where it does**", ""]
        for g in missed:
            cmd = g["command"]
            run = st["summary"][f"corral.run namespace {cmd}"]["median_ms"]
            one = st["summary"][f"sb.exec namespace {cmd}"]["median_ms"]
            raw = st["summary"][f"bwrap {cmd}"]["median_ms"]
            L += [(f"- `{' '.join(st['commands'][cmd])}`: `corral.run` is `Sandbox.exec` "
                  f"({f2(one)} ms, {f2(one / raw)}x) plus making and removing a sandbox: "
                  f"{f2(run - one)} ms here for the policy check, the run directory and its "
                  "lock, the scratch tmpfs (mount, three directories, unmount) and the stale "
                  "sweep, none of which raw bwrap does (it runs in a sandbox opened once). "
                  "It is Python work and small syscalls, slower here than alone because "
                  "every other contender runs between two `corral.run` calls and leaves the "
                  "caches cold; with only corral and raw bwrap alternating "
                  "(`.venv/bin/python bench/startup.py --no-runsc`) the gap is smaller.")]
        L += [""]
    # where corral is slower than a peer
    notes = slower_notes(st)
    if notes:
        L += ["**Where corral is slower than a peer at the same job, and why**", ""]
        L += [f"- {n}" for n in notes] + [""]
    # probes
    L += [("**Does every contender deny the same things?** Before timing, each ran a probe "
          "(`/usr/bin/python3`): write a file in its scratch, write to `/etc`, TCP-connect to "
          "a listener on the host's 127.0.0.1."), ""]
    rows = []
    for n, r in st.get("probes", {}).items():
        if "error" in r:
            rows.append([n, r["error"], "", "", ""])
        else:
            rows.append([n, r["scratch_write"], r["etc_write"], r["host_tcp"],
                         "yes" if r["as_corral_default"] else "**no**"])
    L += table(["contender", "scratch write", "/etc write", "host TCP",
                "as corral's default"], rows, "lllll") + [""]
    # exact commands
    L += ["**Exact commands and configurations**", ""]
    for key in ("bare", "bwrap", "runsc", "corral.run", "sb.exec", "cli", "srt", "codex-npm",
                "codex-native"):
        L.append(f"- `{key}`: {WHAT[key]}")
    L += ["", ("<details><summary>raw bwrap argv (corral's, read from an open Sandbox)"
          "</summary>"), "", "```", " ".join(st["bwrap_argv"]), "```", "</details>", "",
          f"- runsc: `{' '.join(st['runsc_argv'])}`",
          f"- cli: `{' '.join(os.path.relpath(a, ROOT) if a.startswith(ROOT) else a for a in st['cli_argv'])}`",
          "- corral.run / sb.exec: default policy plus `{\"isolation\": TIER}`", ""]
    for n, p in st.get("peers", {}).items():
        argv = " ".join(os.path.relpath(a, ROOT) if a.startswith(ROOT) else a
                        for a in p["argv_prefix"])
        L += [(f"- **{n}** ({p['label']}, version {p['version']}): `{argv} CMD...`, cwd "
              f"`{p['cwd']}` (a fresh directory per benchmark run)")]
        if n == "srt":
            L += ["  - settings file (`--settings`):", "", "    ```json",
                  *["    " + ln for ln in json.dumps(p["config"], indent=1).splitlines()],
                  "    ```", ""]
        else:
            L += [(f"  - `CODEX_HOME={os.path.relpath(p['config']['CODEX_HOME'], ROOT)}` (empty "
                  "config: `-P :workspace` is Codex's built-in workspace-write profile: root "
                  "read-only, the `-C` directory and /tmp writable, network off)")]
        for note in p.get("notes", []):
            L.append(f"  - {note}")
        if p.get("env_changes"):
            L.append("  - environment: the caller's, with " + ", ".join(
                f"`{k}` changed" for k in p["env_changes"]))
    L += ["", ("Peers and corral differ in what they hide beyond that: corral shows only "
          "`/usr`, a minimal `/etc` and its scratch, with a fresh tmpfs scratch, an empty "
          "environment, cgroup limits and a per-run uid; srt and Codex show the whole host "
          "file system read-only, keep the caller's environment and uid and set no "
          "memory/CPU/pids limits. srt's \"no network\" still starts its HTTP+SOCKS proxy and "
          "two socat bridges per run (srt has no proxy-less deny mode)."), ""]
    errs = st.get("errors", {})
    if errs:
        L += ["**Not measured in this run**", ""]
        L += [f"- `{k}`: {v}" for k, v in errs.items()] + [""]
    return L


def slower_notes(st: dict) -> list[str]:
    s = st["summary"]
    peers = [c["name"] for c in st["contenders"] if c["group"] == "peer"]
    notes = []
    for cmd in st["commands"]:
        pm = {p: s[f"{p} {cmd}"]["median_ms"] for p in peers if f"{p} {cmd}" in s}
        if not pm:
            continue
        fastest = min(pm, key=pm.get)
        gv = []
        for c in st["contenders"]:
            if c["group"] in ("floor", "peer"):
                continue
            x = s.get(f"{c['name']} {cmd}")
            if not x or x["median_ms"] <= pm[fastest]:
                continue
            slower = ", ".join(f"{p} ({f2(pm[p], 1)} ms)" for p in pm if x["median_ms"] > pm[p])
            if c["group"] == "gvisor":
                gv.append(f"{c['name']} {f2(x['median_ms'], 1)} ms (slower than {slower})")
                continue
            if c["name"].startswith("cli"):
                inproc = s.get(f"corral.run {c['group']} {cmd}", {}).get("median_ms")
                why = (f"the CLI's Python interpreter start and imports: the same run "
                       f"in-process (`corral.run`) takes {f2(inproc, 1)} ms")
            else:
                why = "see the floors in the table"
            notes.append(f"`{' '.join(st['commands'][cmd])}`: **{c['name']}** "
                         f"({f2(x['median_ms'], 1)} ms) is slower than {slower}: {why}.")
        if gv:
            floor = s.get(f"runsc {cmd}", {}).get("median_ms")
            notes.append(f"`{' '.join(st['commands'][cmd])}`: the **gvisor tier** ("
                         + "; ".join(gv) + ") does a different job: gVisor starts a "
                         "user-space kernel (runsc's sandbox and gofer processes, ptrace "
                         "platform) for every run, and the raw floor `runsc do` alone takes "
                         f"{f2(floor, 1)} ms here; srt and Codex share the host kernel, as "
                         "corral's namespace and process tiers do.")
    return notes


def throughput_section(tp: dict) -> list[str]:
    L = ["## 2. Throughput", "",
         (f"`{' '.join(tp['command'])}` in the namespace tier, as many as possible with P "
         f"workers for {tp['seconds']:g} s; runs per second (finished runs / time until the "
         f"last one finished), median of {tp['rounds']} round(s) with the contenders in "
         "rotated order; ratio to raw bwrap at the same P. Load average "
         f"{tp['loadavg'][0][0]:.2f} at the start, {tp['loadavg'][1][0]:.2f} at the end."), ""]
    par = tp["parallel"]
    names = []
    for s in tp["summary"].values():
        if s["contender"] not in names:
            names.append(s["contender"])
    rows = []
    for n in names:
        cells = []
        for p in par:
            s = tp["summary"][f"{n} {p}"]
            e = f", {s['errors']} err" if s["errors"] else ""
            cells.append(f"{s['per_s']:.1f} ({s['ratio_to_bwrap']:.2f}x{e})")
        rows.append([n] + cells)
    L += table(["runs/s (x bwrap)"] + [f"P={p}" for p in par], rows) + [""]
    L += [("- `corral.run threads`: P threads of one process calling `corral.run` (a fresh "
          "Sandbox each: run dir, scratch tmpfs, seccomp, cgroup, bwrap, teardown)"),
          "- `corral.run processes`: P forked processes, each calling `corral.run` in a loop",
          "- `sb.exec threads`: P threads, each with its own open Sandbox, calling `sb.exec`",
          "- `bwrap threads`: P threads running the raw bwrap argv (as in start-up)", ""]
    errs = {k: v for k, v in ((k, [e for x in xs for e in x["error_samples"]])
                              for k, xs in tp["raw"].items()) if v}
    if errs:
        L += ["Errors during the run (first samples):", ""]
        L += [f"- `{k}`: {sorted(set(v))[:2]}" for k, v in errs.items()] + [""]
        if any("FileNotFoundError" in e and "/scratch" in e for v in errs.values() for e in v):
            L += [("A `FileNotFoundError` on `/run/corral/ID/scratch` is a race in corral, not "
                  "in the benchmark: every new sandbox calls `rundir.sweep_stale()`, which "
                  "treats a run directory whose `lock` file it can flock as dead and removes "
                  "it; `RunDir.__init__` creates that file and only then flocks it, so a "
                  "sandbox starting at the same moment (another thread or process) can remove "
                  "a run directory that is being created."), ""]
    return L


def memory_section(mem: dict) -> list[str]:
    L = ["## 3. Memory of idle live sandboxes", "",
         ("An idle live sandbox is a `Sandbox` running `sb.exec([\"/bin/sleep\", \"3600\"])` in "
         "a thread of the supervisor (a Sandbox with nothing running holds no process). N of "
         "them alive at once in one fresh supervisor process, namespace tier. Per sandbox = "
         "(PSS of every process below the supervisor + the supervisor's own PSS growth) / N, "
         "from /proc/PID/smaps_rollup; the cgroup charge (memory.usage_in_bytes of each run's "
         "cgroup, kernel memory included) is shown for comparison. MB = MiB."), ""]
    rows = []
    for r in mem["points"]:
        if "error" in r:
            rows.append([str(r["n"]), r["network"], "failed: " + r["error"][:120], "", "", "",
                         ""])
            continue
        live = max(r["sleeps_seen"], 1)
        kinds = ", ".join(f"{c} x{e['count']}: {e['pss'] / live / MB:.2f}"
                          for c, e in sorted(r["descendants"].items()))
        rows.append([str(r["n"]), r["network"], f"**{r['per_sandbox_bytes'] / MB:.2f}**",
                     kinds, f"{r['per_sandbox_supervisor_bytes'] / MB:.2f}",
                     f2((r["cgroup_usage_per_sandbox_bytes"] or 0) / MB),
                     f"{r['start_all_s']:.1f} s" + (f"; errors: {r['errors'][:1]}"
                                                    if r["errors"] else "")])
    L += table(["N", "network", "MB per sandbox", "processes, MB per sandbox (PSS)",
                "supervisor share MB", "cgroup charge MB", "all started in"], rows,
               "rlrlrrl") + [""]
    L += [("With `network.mode = \"allow\"` every exec also gets its own egress proxy: a Python "
          "process (`python -I -c 'import corral.egress.boot ...'`) in the run's cgroup, "
          "which dominates the figure: its PSS is mostly anonymous memory (the interpreter's "
          "heap after importing asyncio, ssl, h11 and dnspython; cryptography too when the "
          "policy grants secrets; a bare `python3 -I -c pass` is about 3 MB PSS), and every "
          "proxy is a fresh interpreter, so nothing of it is shared between sandboxes. "
          f"Policy used for allow: `{json.dumps(mem['policies']['allow'])}` (the host "
          "is never contacted)."), ""]
    return L


def network_section(net: dict) -> list[str]:
    L = ["## 4. Network (egress proxy on loopback)", "",
         (f"From `{net['command']}` (bench/network.py, described in bench/README.md): "
         f"{net['runs']} runs; load average {net['machine']['load_start']} at the start, "
         f"{net['machine']['load_end']} at the end."), ""]
    rows = [[v, f"{s['median']:.0f}", f"{s['min']:.0f}", f"{s['max']:.0f}",
             f"{s['ratio']:.2f}x" if s.get("ratio") is not None else "-"]
            for v, s in net["throughput_summary"].items()]
    L += ["Throughput of a 200 MB download (MB/s, curl's figure):", ""]
    L += table(["variant", "median", "min", "max", "x direct"], rows) + [""]
    ls = net["latency_summary"]
    names = {"direct": "host -> server (direct)", "proxy": "host -> standalone proxy -> server",
             "sandbox": "sandbox -> HTTP_PROXY -> server"}
    rows = [[names.get(k, k), f"{s['p50']:.3f}", f"{s['p95']:.3f}",
             f"+{s['added_p50']:.3f}" if k != "direct" else "",
             f"+{s['added_p95']:.3f}" if k != "direct" else ""] for k, s in ls.items()]
    L += ["Latency of a small GET, new connection each (ms):", ""]
    L += table(["client", "p50", "p95", "added p50", "added p95"], rows) + [""]
    rows = [[str(i + 1), str(s.get("ok", 0)), str(sum(s.get("errors", {}).values())),
             f2(s.get("open_s"), 3), f2(s.get("wall_s"), 3)] for i, s in enumerate(net["storm"])]
    L += ["Storm: 500 connections at once from one sandbox through its proxy:", ""]
    L += table(["run", "ok", "errors", "open s", "wall s"], rows) + [""]
    if net.get("sandbox_first_request_ms"):
        xs = sorted(net["sandbox_first_request_ms"])
        L += [(f"A fresh sandbox's first request waits for its proxy process to start: "
              f"{xs[len(xs) // 2]:.0f} ms median here (not in the figures above)."), ""]
    L += ["Goals of issue 3 (from bench/network.py):", ""]
    L += table(["goal", "value", ""], [[g["goal"], g["value"], met(g["met"])]
                                       for g in net["goals"]], "lll") + [""]
    return L


def flood_section(fl: dict) -> list[str]:
    L = ["## 5. Output flood", "",
         (f"`{' '.join(fl['command'])}` (1 GiB on stdout) with `limits.output = "
         f"\"{fl['cap']}\"`; median wall time of {fl['runs']} run(s), the highest peak RSS of "
         "the supervisor process (VmHWM of a child Python running `corral.run`; ru_maxrss for "
         "the CLI). The floor is raw bwrap read and dropped by a Python of the same size."), ""]
    rows = []
    for v, s in fl["summary"].items():
        if "error" in s:
            rows.append([v, "failed: " + str(s["error"])[:100], "", "", ""])
            continue
        rows.append([v, f"{s['wall_s']:.2f} ({f2(s.get('wall_ratio_to_bwrap'))}x)",
                     f"{s['gb_per_s']:.2f}",
                     f"{s['peak_rss_mb']:.1f} ({f2(s.get('rss_ratio_to_bwrap'))}x)", ""])
    L += table(["variant", "wall s (x bwrap)", "GB/s", "peak RSS MB (x bwrap)", ""], rows,
               "lrrrl") + [""]
    c = [x for x in fl["raw"].get("corral.run", []) if "verdict" in x]
    if c:
        L += [(f"corral.run's Result: verdict `{c[-1]['verdict']}`, stdout kept "
              f"{c[-1]['stdout_len']} characters, `stdout_truncated` = "
              f"{c[-1]['stdout_truncated']}: the command ran to the end, the rest was read "
              "and dropped."), ""]
    return L


def main() -> int:
    meta = load("run") or {}
    st, tp, mem, net, fl = (load(n) for n in ("startup", "throughput", "memory", "network",
                                              "flood"))
    goals: list[list[str]] = []
    if st:
        for g in st["goals"]:
            extra = f" ({g['fastest_peer']})" if "fastest_peer" in g else ""
            goals.append([g["goal"], f"`{g['command']}`",
                          f"{g['value_ms']:.2f} ms vs {g['limit_ms']:.2f} ms{extra}",
                          met(g["met"])])
    if tp:
        g = tp["goal"]
        goals.append([g["goal"] + " on 2 cores", "`python3`", (f"best {g['value']:.1f}/s "
                      f"({g['at']})"), met(g["met"])])
    if mem:
        g = mem["goal"]
        goals.append([g["goal"], "`sleep`", f"worst {f2(g['value_mb'])} MB (N={g['at_n']})",
                      met(g["met"])])

    m = (st or tp or {}).get("machine", {})
    L = ["# Benchmarks", "",
         ("<!-- generated by bench/report.py from bench/out/*.json: do not edit; "
         "run the command below instead -->"), "",
         "Everything here comes from one command, run as root from the repository root:", "",
         "```sh", meta.get("command", ".venv/bin/python bench/all.py"), "```", "",
         f"Run {meta.get('started', '?')} to {meta.get('finished', '?')} at commit "
         f"`{meta.get('commit', '?')}`" + (" (with local changes in src/)"
                                           if meta.get("src_dirty") else "") + "."]
    if meta.get("quick"):
        L += ["", ("> **These figures come from `--quick`** (few runs, short windows), and the "
              "machine was shared with other work (see the load averages): they show the "
              "shape, not final numbers. Re-run without `--quick` on a quiet machine.")]
    secs = meta.get("sections", {})
    if secs:
        L += ["", "Load average (1 min) per section, start -> end: " + "; ".join(
            f"{n} {s['loadavg_start'][0]:.2f} -> {s['loadavg_end'][0]:.2f}"
            for n, s in secs.items()) + ". The benchmarks load the machine themselves "
            "(Linux counts runnable tasks and tasks in uninterruptible sleep): start-up "
            "keeps one to two CPUs busy, plus runsc's many threads; throughput runs up to "
            "32 workers and memory keeps 100 sandboxes alive, which lifts the figure to "
            "tens, and it decays over the sections after."]
    L += ["", "## Machine", ""]
    rows = [["CPU", f"{m.get('nproc', '?')} x {m.get('cpu', cpu_model())}"],
            ["VM", m.get("vm", "?")],
            ["kernel", sh(["uname", "-srvm"]) or platform.release()],
            ["cgroup", m.get("cgroup", "?")],
            ["Python", m.get("python", "?")],
            ["bubblewrap", m.get("bwrap", "?")], ["runsc", m.get("runsc", "?")],
            ["corral", m.get("corral", "?")]]
    if st:
        rows += [["node", st["machine"].get("node", "?")]]
        rows += [[k, v] for k, v in st["machine"].get("peers", {}).items()]
    L += table(["", ""], rows, "ll") + [""]

    L += ["## Goals (issue 7)", ""]
    L += table(["goal", "command", "measured (median)", ""], goals, "lllr") + [""]
    L += [("Start-up goals are on medians; \"in-process\" is `corral.run` (a fresh sandbox per "
          "call, teardown included) and also shown for `Sandbox.exec`."), ""]

    if st:
        L += startup_section(st, goals)
    else:
        L += ["## 1. Start-up", "", "not run (bench/out/startup.json missing)", ""]
    L += throughput_section(tp) if tp else ["## 2. Throughput", "", "not run", ""]
    L += memory_section(mem) if mem else ["## 3. Memory", "", "not run", ""]
    L += network_section(net) if net else ["## 4. Network", "", "not run", ""]
    L += flood_section(fl) if fl else ["## 5. Output flood", "", "not run", ""]
    L += ["## How to read these", "",
          ("- Every figure is from this machine, in one run, with corral and its comparisons "
          "interleaved, so drift and other load hit all of them alike; absolute numbers move "
          "between machines and runs, ratios much less."),
          "- The scripts, what each variant does, and more notes: bench/README.md.", ""]
    with open(DOC, "w") as f:
        f.write("\n".join(L).rstrip() + "\n")
    print(f"wrote {os.path.relpath(DOC, ROOT)}")
    if st:
        plot(st)
        print(f"wrote {os.path.relpath(PNG, ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
