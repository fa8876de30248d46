ID = 'fs.proc1-root'
CATEGORY = 'fs-secrets'
DESCRIPTION = 'read the key through /proc/1/root (the root of PID 1)'
CLAIMS = ('host_fs_hidden',)
CODE = """
read_file("/proc/1/root" + FAKE_HOME + "/.ssh/id_ed25519")
"""
CONTROL = {"where": "host", "code": '''
# on the host the probe may not ptrace PID 1 (in a container, say): the same path trick
# through this process's own /proc entry shows the mechanism
read_file(f"/proc/{os.getpid()}/root" + FAKE_HOME + "/.ssh/id_ed25519")
'''}
CONTAINED = "PID 1 is the sandbox's own (or its root is out of reach): no key"
