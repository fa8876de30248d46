ID = 'fs.raw-devices'
CATEGORY = 'fs-secrets'
DESCRIPTION = 'open raw disks and memory devices (/dev/vda, /dev/sda, /dev/nvme0n1, /dev/mem, /dev/kmsg) for reading'
CLAIMS = ('host_fs_hidden',)
CODE = """
opened, errs = [], []
for d in ("/dev/vda", "/dev/sda", "/dev/nvme0n1", "/dev/xvda", "/dev/mem", "/dev/kmem", "/dev/port", "/dev/kmsg"):
    try:
        fd = os.open(d, os.O_RDONLY | os.O_NONBLOCK)   # opened, never read
        os.close(fd); opened.append(d)
    except OSError as e:
        errs.append(f"{d} {ename(e)}")
if opened:
    out("ALLOWED", "opened " + " ".join(opened))
else:
    out("DENIED", "; ".join(errs[:4]))
"""
CONTROL = 'host'
CONTAINED = 'no raw disk or memory device can be opened'
