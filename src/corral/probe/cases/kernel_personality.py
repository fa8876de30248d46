ID = 'kernel.personality'
CATEGORY = 'kernel'
DESCRIPTION = 'personality(READ_IMPLIES_EXEC|ADDR_NO_RANDOMIZE): turn off ASLR and NX for children'
CLAIMS = ('kernel_surface_filtered',)
CODE = r"""
old = libc.personality(0xffffffff)
ctypes.set_errno(0)
r = libc.personality(0x0400000 | 0x0040000)
err = ename(ctypes.get_errno()) if r == -1 else None
if r == -1:
    out("DENIED", f"personality: {err}")
else:
    libc.personality(old); out("ALLOWED", "personality changed")
"""
CONTROL = 'host'
CONTAINED = 'personality with those flags fails with EPERM'
