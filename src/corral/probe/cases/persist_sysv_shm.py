ID = "persist.sysv-shm"
CATEGORY = "persistence"
DESCRIPTION = ("leave a System V shared memory segment behind (it outlives every process) "
               "and find it from the next run: a channel and a foothold across runs")
CLAIMS = ("rule:isolation",)
# libc's shmget/shmctl; the key is the probe run's own, and whoever finds the segment removes it
SHM = """
libc.shmget.argtypes = (ctypes.c_int, ctypes.c_size_t, ctypes.c_int)
libc.shmctl.argtypes = (ctypes.c_int, ctypes.c_int, ctypes.c_void_p)
KEY = int(RUN_ID, 16) & 0x7FFFFFFF
IPC_CREAT, IPC_EXCL, IPC_RMID = 0o1000, 0o2000, 0
"""
CODE = SHM + """
sid = libc.shmget(KEY, 4096, IPC_CREAT | IPC_EXCL | 0o600)
print("created segment" if sid >= 0 else f"shmget: {ename(ctypes.get_errno())}")
"""
SECOND = SHM + """
sid = libc.shmget(KEY, 0, 0)
if sid >= 0:
    libc.shmctl(sid, IPC_RMID, None)
    out("ALLOWED", "the first run's segment was still there (now removed)")
else:
    out("DENIED", f"no segment from the first run: {ename(ctypes.get_errno())}")
"""
CONTROL = {"where": "host", "code": CODE + """
import subprocess
r = subprocess.run([sys.executable, "-c", "import ctypes, os; libc = ctypes.CDLL(None, use_errno=True); "
                    f"print(libc.shmget({KEY}, 0, 0))"], capture_output=True, text=True)
print("another process found id", r.stdout.strip())
""" + SECOND}
CONTAINED = "each sandbox has an IPC namespace of its own: the next run finds no segment"
