ID = 'dos.kill-supervisor'
CATEGORY = 'dos'
DESCRIPTION = 'SIGKILL the parent, every process it can see (kill -1), and the whole process group'
CLAIMS = ('pid_isolation|signals_scoped',)
SAFETY = ('pid_isolation|signals_scoped',)
CODE = r"""
res = []
for what, pid in (("parent", os.getppid()), ("kill -1", -1)):
    if pid == 0:                          # PID 1 of its namespace: no parent to see
        res.append("parent: none visible"); continue
    try:
        os.kill(pid, signal.SIGKILL); res.append(f"{what}: sent")
    except OSError as e:
        res.append(f"{what}: {ename(e)}")
time.sleep(0.2)
out("DENIED", "; ".join(res) + " (the supervisor's survival is seen from outside)")
"""
CONTROL = {'where': 'host', 'code': '\n# the host control kills a sacrificial process of its own, never the probe\nimport subprocess\np = subprocess.Popen(["sleep", "30"])\nos.kill(p.pid, signal.SIGKILL); p.wait()\nout("ALLOWED", f"a visible process was killed ({p.returncode})")\n'}
CONTAINED = 'the supervisor (corral run) survives and returns a Result'


def score(obs):
    if obs.result is None:
        return False, "the supervisor returned no Result"
    return True, "the supervisor survived and returned a Result: " + (
        obs.tag("DENIED") or f"the code itself was killed (verdict {obs.verdict})")
