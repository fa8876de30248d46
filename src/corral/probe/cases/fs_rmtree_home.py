ID = 'fs.rmtree-home'
CATEGORY = 'fs-secrets'
DESCRIPTION = "rm -rf the user's home (the accident)"
CLAIMS = ('host_fs_hidden',)
CODE = """
import shutil
try:
    shutil.rmtree(FAKE_HOME)
    out("ALLOWED", "removed the home")
except OSError as e:
    out("DENIED", f"rmtree: {ename(e)}")
"""
CONTROL = 'host'
CONTAINED = 'every file of the home is still there, unchanged'
