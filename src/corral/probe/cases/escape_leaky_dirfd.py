ID = 'escape.leaky-dirfd'
CATEGORY = 'escape'
DESCRIPTION = "use a directory fd inherited from the supervisor (the host's /) to open a credential (CVE-2024-21626 style)"
CLAIMS = ('rule:env',)
CODE = r"""
rel = FAKE_HOME.lstrip("/") + "/.netrc"
for fd in range(3, 256):
    try:
        f = os.open(rel, os.O_RDONLY, dir_fd=fd)
    except (OSError, ValueError):
        continue
    print(os.read(f, 4096).decode(errors="replace")); out("ALLOWED", f"opened the key relative to fd {fd}")
    sys.exit(0)
try:
    print(open(f"/proc/self/cwd/{'../' * 16}{rel}").read()); out("ALLOWED", "through /proc/self/cwd")
except OSError as e:
    out("DENIED", f"no inherited directory fd; /proc/self/cwd: {ename(e)}")
"""
CONTROL = 'host'
CONTAINED = 'no host directory fd is inherited'
