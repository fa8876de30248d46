ID = "net.vsock-bind"
CATEGORY = "network"
DESCRIPTION = "bind and listen on a vsock port: vsock is not namespaced, so it reaches the host VM and its hypervisor"
CLAIMS = ("kernel_surface_filtered",)
CODE = r"""
try:
    s = socket.socket(socket.AF_VSOCK, socket.SOCK_STREAM)
except OSError as e:
    if ON_HOST:
        out("UNSUPPORTED", f"this host has no vsock (socket(AF_VSOCK): {ename(e)})")
    else:
        out("DENIED", f"socket(AF_VSOCK): {ename(e)}")
else:
    with s:
        try:
            s.bind((socket.VMADDR_CID_ANY, socket.VMADDR_PORT_ANY))
            s.listen()
            out("ALLOWED", f"listening on vsock port {s.getsockname()[1]}")
        except OSError as e:
            out("DENIED", f"vsock bind: {ename(e)}")
"""
CONTROL = "host"
CONTAINED = "socket(AF_VSOCK) fails (EAFNOSUPPORT; EPERM on the process tier): no vsock port is taken"
