ID = 'fs.write-shared'
CATEGORY = 'fs-secrets'
DESCRIPTION = 'write into a world-writable host directory outside scratch'
CLAIMS = ('host_fs_hidden',)
CODE = """
try:
    with open(HOST_DIR + "/dropped", "w") as f:
        f.write("planted")
    out("ALLOWED", "wrote a host file")
except OSError as e:
    out("DENIED", f"open: {ename(e)}")
"""
CONTROL = 'host'
CONTAINED = 'no file appears in the host directory'
