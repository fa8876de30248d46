ID = 'escape.modprobe'
CATEGORY = 'escape'
DESCRIPTION = 'write /proc/sys/kernel/modprobe (the helper the kernel runs as root)'
CLAIMS = ('no_host_root',)
CODE = r"""
p = '/proc/sys/kernel/modprobe'
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
CONTAINED = 'the write fails; the probe writes back the current value only'
