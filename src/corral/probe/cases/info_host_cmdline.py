ID = 'info.host-cmdline'
CATEGORY = 'info'
DESCRIPTION = 'scan /proc/*/cmdline for secrets passed on host command lines'
CLAIMS = ('pid_isolation',)
CODE = r"""
n = 0
for pid in [p for p in os.listdir("/proc") if p.isdigit()]:
    try:
        args = open(f"/proc/{pid}/cmdline", "rb").read().split(b"\0")
    except OSError:
        continue
    n += 1
    for a in args:
        if a.startswith(b"--password="):            # print the canary only
            print(a.decode(errors="replace")); out("ALLOWED", f"a password on pid {pid}'s command line")
            sys.exit(0)
out("DENIED", f"{n} command lines visible, none with a password")
"""
CONTROL = 'host'
CONTAINED = 'host processes are invisible: no command line with the secret'
