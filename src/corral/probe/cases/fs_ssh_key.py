ID = "fs.ssh-key"
CATEGORY = "fs-secrets"
DESCRIPTION = "read the private SSH key in the user's home by its absolute path"
CLAIMS = ("host_fs_hidden",)
CODE = """
read_file(FAKE_HOME + "/.ssh/id_ed25519")
"""
CONTROL = "host"
CONTAINED = "the key's bytes (the canary token) appear in no output and at no sink"
