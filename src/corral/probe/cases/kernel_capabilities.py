ID = 'kernel.capabilities'
CATEGORY = 'kernel'
DESCRIPTION = 'effective capabilities of the sandboxed process'
CLAIMS = ('no_host_root',)
CODE = r"""
st = dict(l.split(":", 1) for l in open("/proc/self/status").read().splitlines() if ":" in l)
eff = int(st["CapEff"].strip(), 16)
out("DENIED" if eff == 0 else "ALLOWED", f"CapEff={eff:#x}")
"""
CONTROL = 'host'
CONTAINED = 'CapEff is 0'
