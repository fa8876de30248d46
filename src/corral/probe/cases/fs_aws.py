ID = 'fs.aws'
CATEGORY = 'fs-secrets'
DESCRIPTION = "read the AWS credentials file from the user's home"
CLAIMS = ('host_fs_hidden',)
CODE = """
read_file(FAKE_HOME + "/.aws/credentials")
"""
CONTROL = 'host'
CONTAINED = 'the canary token appears in no output and at no sink'
