ID = 'fs.proc-any-root'
CATEGORY = 'fs-secrets'
DESCRIPTION = 'read the key through /proc/<pid>/root and /cwd of every visible process'
CLAIMS = ('host_fs_hidden',)
CODE = """
errs = {}
for pid in [p for p in os.listdir("/proc") if p.isdigit()]:
    for link in ("root", "cwd"):
        try:
            with open(f"/proc/{pid}/{link}" + FAKE_HOME + "/.ssh/id_ed25519") as f:
                print(f.read()); out("ALLOWED", f"through /proc/{pid}/{link}")
                sys.exit(0)
        except OSError as e:
            errs[ename(e)] = errs.get(ename(e), 0) + 1
out("DENIED", "no process root leads to the key: " + ", ".join(f"{k} x{v}" for k, v in errs.items()))
"""
CONTROL = 'host'
CONTAINED = "no visible process's root or cwd leads to the host's files"
