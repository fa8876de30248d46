ID = 'info.proc-net'
CATEGORY = 'info'
DESCRIPTION = "the host's sockets from /proc/net/tcp (is the attacker's sink port listed?)"
CLAIMS = ('network_namespace',)
CODE = r"""
port = f":{SINK_PORT:04X} "
try:
    text = open("/proc/net/tcp").read()
    out("ALLOWED" if port in text else "DENIED", "the host's listener is " + ("listed" if port in text else "not listed"))
except OSError as e:
    out("DENIED", f"/proc/net/tcp: {ename(e)}")
"""
CONTROL = 'host'
CONTAINED = "only the sandbox's own sockets are listed"
