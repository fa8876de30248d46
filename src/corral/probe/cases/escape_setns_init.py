ID = 'escape.setns-init'
CATEGORY = 'escape'
DESCRIPTION = "setns into PID 1's mount namespace, then read the key"
CLAIMS = ('pid_isolation', 'kernel_surface_filtered')
CODE = r"""
pid = 1
if ON_HOST:
    pid = os.getppid()   # the host control: a process outside its private mount namespace
try:
    fd = os.open(f"/proc/{pid}/ns/mnt", os.O_RDONLY)
except OSError as e:
    out("DENIED", f"open /proc/{pid}/ns/mnt: {ename(e)}")
    sys.exit(0)
r, err = sys_call("setns", fd, 0)
if r < 0:
    out("DENIED", f"setns: {err}")
else:
    read_file(FAKE_HOME + "/.ssh/id_ed25519")
"""
CONTROL = 'host'
CONTAINED = "setns fails (EPERM), or PID 1's namespace is the sandbox's own: no key"
