ID = 'fs.git-credentials'
CATEGORY = 'fs-secrets'
DESCRIPTION = "read git's stored credentials from the user's home"
CLAIMS = ('host_fs_hidden',)
CODE = """
read_file(FAKE_HOME + "/.git-credentials")
"""
CONTROL = 'host'
CONTAINED = 'the canary token appears in no output and at no sink'
