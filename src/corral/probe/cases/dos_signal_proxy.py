from ._net import ALLOW

ID = "dos.signal-proxy"
CATEGORY = "dos"
DESCRIPTION = ("find the run's egress proxy, the supervisor and the probe (the proxy runs as the sandbox's uid) "
               "and check whether a signal would reach them (kill with signal 0: nothing is sent)")
CLAIMS = ("pid_isolation|signals_scoped",)
POLICY = ALLOW
CODE = """
me = os.getpid()
found, reach = [], []
for d in os.listdir("/proc"):
    if not d.isdigit() or int(d) == me:
        continue
    try:
        cmd = open(f"/proc/{d}/cmdline", "rb").read()
    except OSError:
        continue
    argv = cmd.split(b"\\0")      # whole arguments: the sandbox's own code mentions these names
    if any((a == b"-m" and b in (b"corral.egress", b"corral.cli"))
           or (a.endswith(b"/corral") and b == b"probe") for a, b in zip(argv, argv[1:])):
        found.append(d)
        try:
            os.kill(int(d), 0)            # the permission check only
            reach.append(d)
        except OSError as e:
            pass
if reach:
    out("ALLOWED", f"{len(reach)} of {len(found)} corral processes (supervisor, proxy) could be signalled")
else:
    out("DENIED", f"{len(found)} corral processes visible, none signallable")
"""
CONTROL = "host"
CONTAINED = "no process of corral's own (supervisor, proxy) can be signalled from the sandbox"
