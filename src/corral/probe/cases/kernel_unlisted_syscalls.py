ID = "kernel.unlisted-syscalls"
CATEGORY = "kernel"
DESCRIPTION = "newer kernel interfaces a deny list forgets: process_madvise, cachestat, statmount, listmount, lsm_list_modules, mseal, file_getattr"
CLAIMS = ("kernel_surface_filtered",)
CODE = r"""
import mmap
page = mmap.mmap(-1, mmap.PAGESIZE)
addr = ctypes.addressof(ctypes.c_char.from_buffer(page))
fd = os.open(sys.executable, os.O_RDONLY)
rng, cst, size = (ctypes.c_uint64 * 2)(), (ctypes.c_uint64 * 5)(), ctypes.c_uint64(0)
u = ctypes.c_ulong
calls = {"process_madvise": (440, u(2**64 - 1), None, u(0), u(0), u(0)),  # EBADF past the filter
         "cachestat": (451, u(fd), rng, cst, u(0)),
         "statmount": (457, None, None, u(0), u(0)),                       # EFAULT
         "listmount": (458, None, None, u(0), u(0)),
         "lsm_list_modules": (461, None, ctypes.byref(size), u(0)),
         "mseal": (462, u(addr), u(mmap.PAGESIZE), u(1)),                 # EINVAL: bad flags
         "file_getattr": (468, u(2**64 - 100), None, None, u(0), u(0))}
passed = []
for name, (nr, *args) in calls.items():
    ctypes.set_errno(0)
    r = libc.syscall(ctypes.c_long(nr), *args)
    e = ctypes.get_errno() if r < 0 else 0
    if e not in (errno.ENOSYS, errno.EPERM):
        passed.append(f"{name}: {ename(e) if e else 'ok'}")
os.close(fd)
if passed:
    out("ALLOWED", "past the filter: " + ", ".join(passed))
elif ON_HOST:
    out("UNSUPPORTED", "this kernel has none of these calls")
else:
    out("DENIED", "every call answered ENOSYS or EPERM")
"""
CONTROL = "host"
CONTAINED = "every call answers ENOSYS (not on the allow list; gVisor does not implement them)"
