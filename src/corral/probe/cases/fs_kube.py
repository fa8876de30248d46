ID = 'fs.kube'
CATEGORY = 'fs-secrets'
DESCRIPTION = "read the Kubernetes config with a bearer token from the user's home"
CLAIMS = ('host_fs_hidden',)
CODE = """
read_file(FAKE_HOME + "/.kube/config")
"""
CONTROL = 'host'
CONTAINED = 'the canary token appears in no output and at no sink'
