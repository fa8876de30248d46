ID = 'fs.symlink'
CATEGORY = 'fs-secrets'
DESCRIPTION = 'plant a symlink to the key in the writable directory and read through it'
CLAIMS = ('host_fs_hidden',)
CODE = """
dst = os.path.join(SCRATCH, "key-link")
os.symlink(FAKE_HOME + "/.ssh/id_ed25519", dst)
read_file(dst)
"""
CONTROL = 'host'
CONTAINED = "the link resolves inside the sandbox's view: no key"
