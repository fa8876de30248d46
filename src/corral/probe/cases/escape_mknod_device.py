ID = 'escape.mknod-device'
CATEGORY = 'escape'
DESCRIPTION = "mknod a block device node for the host's root disk in the writable directory and open it"
CLAIMS = ('kernel_surface_filtered',)
CODE = r"""
import stat as _st
dev = os.stat("/usr").st_dev
p = os.path.join(SCRATCH, "disk")
try:
    os.mknod(p, 0o600 | _st.S_IFBLK, dev)
except OSError as e:
    out("DENIED", f"mknod: {ename(e)}")
else:
    try:
        os.close(os.open(p, os.O_RDONLY)); out("ALLOWED", "made and opened a node for the host's disk")
    except OSError as e:   # the node exists: only a device cgroup stands between it and the disk
        out("ALLOWED", f"made a device node for the host's disk (open: {ename(e)})")
    os.unlink(p)
"""
CONTROL = 'host'
CONTAINED = 'mknod of a device node fails (EPERM)'
