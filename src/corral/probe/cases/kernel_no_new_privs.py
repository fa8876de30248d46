ID = 'kernel.no-new-privs'
CATEGORY = 'kernel'
DESCRIPTION = 'can a setuid helper (sudo, su, newuidmap) raise privileges? (NoNewPrivs)'
CLAIMS = ('no_host_root',)
CODE = r"""
nnp = str(libc.prctl(39, 0, 0, 0, 0))   # PR_GET_NO_NEW_PRIVS (gVisor's status file lacks the line)
out("DENIED" if nnp == "1" else "ALLOWED", f"NoNewPrivs={nnp}: setuid binaries " + ("cannot" if nnp == "1" else "can") + " raise privileges")
"""
CONTROL = 'host'
CONTAINED = 'NoNewPrivs is 1: exec of a setuid binary gains nothing'
