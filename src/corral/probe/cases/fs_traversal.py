ID = 'fs.traversal'
CATEGORY = 'fs-secrets'
DESCRIPTION = 'reach the home through ../ from the writable directory'
CLAIMS = ('host_fs_hidden',)
CODE = """
read_file(SCRATCH + "/.." * 16 + FAKE_HOME + "/.ssh/id_ed25519")
"""
CONTROL = 'host'
CONTAINED = "the traversal ends in the sandbox's own root: no key"
