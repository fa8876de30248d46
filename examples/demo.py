"""The corral demo: run an untrusted script that tries to steal secrets, reach the
network, delete files and fork-bomb, and show each attempt contained.

Run it with `bash scripts/demo.sh` (which sets everything up first)."""

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
CORRAL = os.path.join(os.path.dirname(HERE), ".venv", "bin", "corral")


def corral(*args, **kw):
    return subprocess.run([CORRAL, *args], capture_output=True, text=True, **kw)


def main() -> int:
    print("== corral doctor")
    doc = corral("doctor", "--json")
    facts = json.loads(doc.stdout)
    print(corral("doctor").stdout)
    if facts["tiers"]["namespace"] is not True or "pids" not in facts["cgroups"]["usable"]:
        print("demo: the namespace tier or the pids cgroup is missing here; the demo needs "
              "both before it runs anything destructive. See `corral doctor`.")
        return 1

    # a pre-flight run: is isolation really in place? (hidden host paths, read-only root)
    work = tempfile.mkdtemp(prefix="corral-demo-")
    canary = os.path.join(work, "canary")
    open(canary, "w").write("visible")
    pre = corral("run", "--json", "--", "/bin/sh", "-c",
                 f"test ! -e {canary} && ! touch /usr/.corral-preflight 2>/dev/null && echo isolated")
    if "isolated" not in json.loads(pre.stdout).get("stdout", ""):
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
    run = corral("run", "--json", "--pids", "64", "--memory", "256M", "--timeout", "20s",
                 "--ro-bind", HERE, "--", "/usr/bin/python3", os.path.join(HERE, "untrusted.py"),
                 home, project, str(port), env=env)
    result = json.loads(run.stdout)
    contained = 0
    lines = [json.loads(x) for x in result["stdout"].splitlines() if x.startswith("{")]
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
    oom = corral("run", "--json", "--memory", "128M", "--", "/usr/bin/python3", "-c",
                 "b = bytearray(1 << 30); print('allocated')")
    r = json.loads(oom.stdout)
    print(f"  verdict {r['verdict']} (exit status of corral: {oom.returncode})")
    print("== corral run --timeout 1s -- sleep 100")
    slow = corral("run", "--json", "--timeout", "1s", "--", "sleep", "100")
    r2 = json.loads(slow.stdout)
    print(f"  verdict {r2['verdict']} after {r2['usage']['wall_s']:.2f}s (exit status {slow.returncode})")
    shutil.rmtree(work)
    good = (contained == len(lines) and len(lines) >= 9 and intact and not backdoor
            and r["verdict"] == "oom" and r2["verdict"] == "timeout")
    print("\nevery attempt contained." if good else "\nSOMETHING WAS NOT CONTAINED: see above.")
    return 0 if good else 1


if __name__ == "__main__":
    sys.exit(main())
