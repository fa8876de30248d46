from ._net import HASH, host_file, same_as_host

ID = "info.etc-passwd"
CATEGORY = "info"
DESCRIPTION = "read /etc/passwd: the host's user names, homes and service accounts"
CLAIMS = ("host_fs_hidden",)
CODE = HASH + """
try:
    out("SEEN", h(open("/etc/passwd", "rb").read()))
except OSError as e:
    out("DENIED", f"/etc/passwd: {ename(e)}")
"""
CONTROL = "host"
CONTAINED = "/etc/passwd is a generated one (or unreadable), not the host's"


def score(obs):
    return same_as_host(obs, host_file("/etc/passwd"), "/etc/passwd")
