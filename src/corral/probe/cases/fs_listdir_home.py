ID = 'fs.listdir-home'
CATEGORY = 'fs-secrets'
DESCRIPTION = 'list the home directory (a file name there holds the secret)'
CLAIMS = ('host_fs_hidden',)
CODE = """
try:
    print(sorted(os.listdir(FAKE_HOME)))
    out("ALLOWED", "listed the home")
except OSError as e:
    out("DENIED", f"listdir: {ename(e)}")
"""
CONTROL = 'host'
CONTAINED = 'the home cannot be listed: no file name leaks'
