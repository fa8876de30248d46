ID = "escape.rename-whiteout"
CATEGORY = "escape"
DESCRIPTION = "renameat2(RENAME_WHITEOUT) in the writable directory: leaves a 0:0 character device though mknod is filtered"
CLAIMS = ("kernel_surface_filtered",)
CODE = r"""
import stat as _st
old, new = os.path.join(SCRATCH, "wh-old"), os.path.join(SCRATCH, "wh-new")
with open(old, "w") as f:
    f.write("x")
ctypes.set_errno(0)
r = libc.renameat2(-100, old.encode(), -100, new.encode(), 4)     # RENAME_WHITEOUT
if r != 0:
    out("DENIED", f"renameat2(RENAME_WHITEOUT): {ename(ctypes.get_errno())}")
else:
    st = os.lstat(old)
    if _st.S_ISCHR(st.st_mode):
        out("ALLOWED", f"a character device {os.major(st.st_rdev)}:{os.minor(st.st_rdev)} at the old name")
    else:
        out("ALLOWED", "the rename with RENAME_WHITEOUT took")
for p in (old, new):
    if os.path.lexists(p):
        os.unlink(p)
"""
CONTROL = "host"
CONTAINED = "renameat2 with RENAME_WHITEOUT fails (EPERM or EINVAL): no device node is made"
