ID = 'escape.core-pattern'
CATEGORY = 'escape'
DESCRIPTION = 'write /proc/sys/kernel/core_pattern (a pipe there runs as host root on a crash)'
CLAIMS = ('no_host_root',)
CODE = r"""
p = '/proc/sys/kernel/core_pattern'
if ON_HOST and not os.path.exists(p):
    out("UNSUPPORTED", f"{p} does not exist in this kernel")
    sys.exit(0)
if ON_HOST and os.geteuid() != 0:
    out("UNSUPPORTED", "the host control needs root")
    sys.exit(0)
try:
    with open(p, "rb") as f:
        cur = f.read()
except OSError as e:
    out("DENIED", f"read {p}: {ename(e)}")
    sys.exit(0)
try:
    with open(p, "wb") as f:
        f.write(cur)                      # its own current value, nothing else
    out("ALLOWED", f"wrote {p} (its own value back)")
except OSError as e:
    out("DENIED", f"write {p}: {ename(e)}")
"""
CONTROL = 'host'
CONTAINED = 'the write fails (EROFS, EACCES or EPERM); the probe writes back the current value only'
