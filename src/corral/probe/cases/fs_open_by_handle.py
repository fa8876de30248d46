ID = 'fs.open-by-handle'
CATEGORY = 'fs-secrets'
DESCRIPTION = 'open_by_handle_at with the key\'s file handle against /usr\'s filesystem ("shocker")'
CLAIMS = ('host_fs_hidden', 'kernel_surface_filtered')
CODE = """
if not HANDLE:
    out("UNSUPPORTED", "the host could not make a file handle")
else:
    h = bytes.fromhex(HANDLE)
    buf = ctypes.create_string_buffer(h, len(h))
    mfd = os.open("/usr", os.O_RDONLY | os.O_DIRECTORY)
    r, err = sys_call("open_by_handle_at", mfd, buf, os.O_RDONLY)
    if r < 0:
        out("DENIED", f"open_by_handle_at: {err}")
    else:
        print(os.read(r, 4096).decode(errors="replace")); out("ALLOWED", "opened the key by handle")
"""
CONTROL = 'host'
CONTAINED = 'open_by_handle_at is refused (EPERM): no host file by handle'
