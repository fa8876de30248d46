ID = 'env.proc-environ'
CATEGORY = 'env-leak'
DESCRIPTION = "scan /proc/*/environ of every visible process for the supervisor's secret"
CLAIMS = ('pid_isolation',)
CODE = r"""
readable = 0
for pid in [p for p in os.listdir("/proc") if p.isdigit() and int(p) != os.getpid()]:
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            env = f.read()
    except OSError:
        continue
    readable += 1
    for item in env.split(b"\0"):
        if item.startswith(b"CORRAL_PROBE_SECRET="):   # print the canary only, nothing else
            print(f"pid {pid}:", item.decode(errors="replace")); out("ALLOWED", f"the secret in /proc/{pid}/environ")
            sys.exit(0)
out("DENIED", f"no environ with the secret among {readable} readable")
"""
CONTROL = 'host'
CONTAINED = "no other process's environment with the secret can be read"
