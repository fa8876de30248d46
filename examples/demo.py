"""The corral demo: run an untrusted script that tries to steal secrets, reach the
network, delete files and fork-bomb, and show each attempt contained.

Run it with `bash scripts/demo.sh` (which sets everything up first), or
`python3 examples/demo.py --corral PATH` with a corral installed elsewhere."""

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
CORRAL = os.path.join(os.path.dirname(HERE), ".venv", "bin", "corral")


class Failed(Exception):
    """corral itself refused or failed: its own message, shown as is."""


def corral(*args, **kw):
    return subprocess.run([CORRAL, *args], capture_output=True, text=True, **kw)


def run_json(*args, **kw) -> dict:
    """`corral run --json ARGS`: the Result as a dict, or Failed with corral's own error."""
    p = corral("run", "--json", *args, **kw)
    try:
        doc = json.loads(p.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        doc = None
    if isinstance(doc, dict) and "verdict" in doc:
        return doc
    if isinstance(doc, dict) and "error" in doc:
        e = doc["error"]
        raise Failed(f"{e.get('field')}: {e.get('message')}" if e.get("field") else e.get("message"))
    last = (p.stderr.strip().splitlines() or [f"no output, exit status {p.returncode}"])[-1]
    raise Failed(last)


def main() -> int:
    global CORRAL
    if sys.argv[1:2] == ["--corral"] and len(sys.argv) > 2:
        CORRAL = sys.argv[2]
    if not os.access(CORRAL, os.X_OK):
        print(f"demo: {CORRAL} is not there; run bash scripts/demo.sh (it installs corral "
              f"first) or pass --corral PATH")
        return 1
    try:
        return demo()
    except Failed as e:
        print(f"demo: a corral run failed: corral: {e}")
        return 1


def demo() -> int:
    print("== corral doctor")
    doc = corral("doctor", "--json")
    try:
        facts = json.loads(doc.stdout)
    except ValueError:
        raise Failed((doc.stderr.strip().splitlines() or ["corral doctor gave no report"])[-1])
    print(corral("doctor").stdout)
    if facts["tiers"]["namespace"] is not True or "pids" not in facts["cgroups"]["usable"]:
        print("demo: the namespace tier or the pids cgroup is missing here; the demo needs "
              "both before it runs anything destructive. See `corral doctor`.")
        return 1

    # a pre-flight run: is isolation really in place? (hidden host paths, read-only root)
    work = tempfile.mkdtemp(prefix="corral-demo-")
    canary = os.path.join(work, "canary")
    open(canary, "w").write("visible")
    pre = run_json("--", "/bin/sh", "-c",
                   f"test ! -e {canary} && ! touch /usr/.corral-preflight 2>/dev/null && echo isolated")
    if "isolated" not in pre["stdout"]:
        print("demo: pre-flight failed: the sandbox can see or write host files; stopping.")
        return 1

    home = os.path.join(work, "home")
    os.makedirs(os.path.join(home, ".ssh"))
    open(os.path.join(home, ".ssh", "id_ed25519"), "w").write("-----BEGIN OPENSSH PRIVATE KEY----- demo\n")
    project = os.path.join(work, "project")
    os.makedirs(project)
    open(os.path.join(project, "main.py"), "w").write("print('precious')\n")
    sink = socket.socket()
    sink.bind(("127.0.0.1", 0))
    sink.listen(1)
    sink.settimeout(0)
    port = sink.getsockname()[1]

    print("== corral run --pids 64 --memory 256M -- python3 untrusted.py")
    env = dict(os.environ, DEMO_SECRET_TOKEN="sk-demo-0123456789")
    result = run_json("--pids", "64", "--memory", "256M", "--timeout", "20s",
                      "--ro-bind", HERE, "--", "/usr/bin/python3",
                      os.path.join(HERE, "untrusted.py"), home, project, str(port), env=env)
    contained = 0
    lines = []
    for x in result["stdout"].splitlines():   # the script's report: one JSON object a line
        try:
            item = json.loads(x)
        except ValueError:
            continue
        if isinstance(item, dict) and isinstance(item.get("attempt"), str) and isinstance(
                item.get("outcome"), str):
            lines.append(item)
    for item in lines:
        allowed = "allowed" in item["attempt"]
        ok = item["outcome"].startswith("failed") != allowed
        contained += ok
        mark = "contained" if ok and not allowed else ("works" if ok else "NOT CONTAINED")
        print(f"  [{mark:>13}] {item['attempt']}\n                  {item['outcome'][:110]}")
    try:
        sink.accept()
        print("  the attacker's listener received a connection: NOT CONTAINED")
        contained -= 1
    except BlockingIOError:
        pass
    intact = os.path.exists(os.path.join(project, "main.py"))
    backdoor = os.path.exists("/usr/bin/corral-demo-backdoor")
    print(f"  project directory intact on the host: {intact}; /usr/bin untouched: {not backdoor}")
    print(f"  verdict {result['verdict']}, exit {result['exit_code']}, "
          f"peak memory {result['usage']['memory_peak_bytes']} bytes, "
          f"events: {[e.get('limit') or e['kind'] for e in result['events']]}")

    print("== corral run --memory 128M -- python3 -c 'allocate 1 GiB'")
    r = run_json("--memory", "128M", "--", "/usr/bin/python3", "-c",
                 "b = bytearray(1 << 30); print('allocated')")
    print(f"  verdict {r['verdict']} (exit code {r['exit_code']}, signal {r['signal']})")
    print("== corral run --timeout 1s -- sleep 100")
    r2 = run_json("--timeout", "1s", "--", "sleep", "100")
    print(f"  verdict {r2['verdict']} after {r2['usage']['wall_s']:.2f}s")
    shutil.rmtree(work)
    good = (contained == len(lines) and len(lines) >= 9 and intact and not backdoor
            and r["verdict"] == "oom" and r2["verdict"] == "timeout")
    print("\nevery attempt contained." if good else "\nSOMETHING WAS NOT CONTAINED: see above.")
    return 0 if good else 1


if __name__ == "__main__":
    sys.exit(main())
