ID = "fs.workspace-symlink"
CATEGORY = "fs-secrets"
DESCRIPTION = ("name as the workspace a path through a link an earlier read-write run planted "
               "(workspace/sub -> the user's home) and read the key in it")
CLAIMS = ("host_fs_hidden",)
POLICY = {"filesystem": {"workspace": {"path": "{PROBE_ROOT}/workspace/sub", "mode": "ro"}}}
CODE = """
read_file(".ssh/id_ed25519")      # the working directory is the workspace
"""
# the link really leads to the key: read through it on the host
CONTROL = {"where": "host", "code": 'read_file(PROBE_ROOT + "/workspace/sub/.ssh/id_ed25519")'}
REFUSED_BY = "filesystem.workspace.path"
CONTAINED = ("corral refuses a workspace path with a symbolic link in it (and opens the path "
             "without following one when it builds the sandbox)")
