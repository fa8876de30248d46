ID = 'escape.release-agent'
CATEGORY = 'escape'
DESCRIPTION = 'mount a cgroup v1 hierarchy and write its release_agent (CVE-2022-0492)'
CLAIMS = ('kernel_surface_filtered',)
CODE = r"""
t = os.path.join(SCRATCH, "cg"); os.makedirs(t, exist_ok=True)
r, err = sys_call("mount", b"cgroup", t.encode(), b"cgroup", 0, b"none,name=corralprobe")
if r < 0:
    out("DENIED", f"mount cgroup: {err}")
else:
    try:
        p = os.path.join(t, "release_agent")
        cur = open(p, "rb").read()
        with open(p, "wb") as f:
            f.write(cur or b"\n")          # its own (empty) value back
        out("ALLOWED", "mounted a cgroup hierarchy and wrote release_agent")
    except OSError as e:
        out("ALLOWED", f"mounted a cgroup hierarchy (release_agent: {ename(e)})")
    finally:
        sys_call("umount2", t.encode(), 2)
"""
CONTROL = 'host'
CONTAINED = 'the cgroup mount fails with EPERM'
