ID = 'info.stat-home'
CATEGORY = 'info'
DESCRIPTION = "stat the user's key: does the file exist, how big is it?"
CLAIMS = ('host_fs_hidden', 'rule:isolation')
CODE = r"""
try:
    st = os.stat(FAKE_HOME + "/.ssh/id_ed25519")
    out("ALLOWED", f"~/.ssh/id_ed25519 exists, {st.st_size} bytes")
except OSError as e:
    out("DENIED", f"stat: {ename(e)}")
"""
CONTROL = 'host'
CONTAINED = "the file does not exist in the sandbox's view"
