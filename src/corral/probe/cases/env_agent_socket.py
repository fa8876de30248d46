ID = 'env.agent-socket'
CATEGORY = 'env-leak'
DESCRIPTION = "talk to the user's ssh-agent socket ($SSH_AUTH_SOCK, or its path)"
CLAIMS = ('host_fs_hidden',)
CODE = r"""
path = os.environ.get("SSH_AUTH_SOCK") or AGENT_SOCK
try:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(2); s.connect(path)
        print(s.recv(4096).decode(errors="replace")); out("ALLOWED", "the agent answered")
except OSError as e:
    out("DENIED", f"connect {short(path)}: {ename(e)}")
"""
CONTROL = 'host'
CONTAINED = 'the agent socket is unreachable: no identity'
