ID = 'fs.docker'
CATEGORY = 'fs-secrets'
DESCRIPTION = "read the Docker registry auth file from the user's home"
CLAIMS = ('host_fs_hidden',)
CODE = """
read_file(FAKE_HOME + "/.docker/config.json")
"""
CONTROL = 'host'
CONTAINED = 'the canary token appears in no output and at no sink'
