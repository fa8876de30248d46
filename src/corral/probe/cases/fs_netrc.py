ID = 'fs.netrc'
CATEGORY = 'fs-secrets'
DESCRIPTION = "read ~/.netrc with a machine password from the user's home"
CLAIMS = ('host_fs_hidden',)
CODE = """
read_file(FAKE_HOME + "/.netrc")
"""
CONTROL = 'host'
CONTAINED = 'the canary token appears in no output and at no sink'
