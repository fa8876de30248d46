ID = 'fs.hardlink'
CATEGORY = 'fs-secrets'
DESCRIPTION = 'hard-link the key into the writable directory, then read the link'
CLAIMS = ('host_fs_hidden',)
CODE = """
dst = os.path.join(SCRATCH, "linked-key")
try:
    os.link(FAKE_HOME + "/.ssh/id_ed25519", dst)
except OSError as e:
    out("DENIED", f"link: {ename(e)}")
else:
    read_file(dst)
    os.unlink(dst)
"""
CONTROL = 'host'
CONTAINED = 'the link cannot be made'
