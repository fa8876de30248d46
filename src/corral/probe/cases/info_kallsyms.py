ID = 'info.kallsyms'
CATEGORY = 'info'
DESCRIPTION = 'kernel symbol addresses from /proc/kallsyms (defeats KASLR)'
CLAIMS = ('no_host_root',)
CODE = r"""
try:
    addrs = [l.split()[0] for l in open("/proc/kallsyms").read().splitlines()[:2000]]
    real = [a for a in addrs if int(a, 16) != 0]
    out("ALLOWED" if real else "DENIED", f"{len(real)} of {len(addrs)} addresses are real")
except OSError as e:
    out("DENIED", f"/proc/kallsyms: {ename(e)}")
"""
CONTROL = 'host'
CONTAINED = 'the addresses read as zeros, or the file is absent'
