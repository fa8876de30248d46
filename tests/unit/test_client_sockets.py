"""The SDK leaves no socket of its own to the collector at exit: the sync clients' shared
connection pool (client/_common.py: a Sandbox's close leaves it open for the next one)
and the exec fast path's idle connections (client/_fast.py) are closed by the SDK itself
when the process exits, so no "ResourceWarning: unclosed <socket.socket ...>" comes at
interpreter shutdown. Real sockets: a client process talking to an HTTP server on
127.0.0.0/8 (in the test's own process)."""

import http.server
import subprocess
import sys
import textwrap
import threading

CLIENT = textwrap.dedent("""
    import atexit, os, stat, sys

    def sockets():
        n = 0
        for fd in os.listdir("/proc/self/fd"):
            try:
                n += stat.S_ISSOCK(os.stat(f"/proc/self/fd/{fd}").st_mode)
            except OSError:
                pass
        return n

    # registered first, so it runs last: after the SDK's own exit handlers
    atexit.register(lambda: print("left", sockets(), flush=True))

    from corral.client import _fast
    from corral.client._common import sync_client

    for _ in range(2):        # two Sandboxes' clients in turn (create, kill: close())
        c = sync_client(sys.argv[1], {"Authorization": "Bearer x"})
        assert c.get("/").text == "ok"
        route = _fast.route_of(c)
        assert route is not None
        assert _fast.post_exec(route, "sb", {}, 10)[0] == 200
        c.close()
    # Sandbox.list's way: a client in a `with`, whose end must leave the shared pool be
    with sync_client(sys.argv[1], {"Authorization": "Bearer x"}) as c:
        assert c.get("/").text == "ok"
    print("open", sockets(), flush=True)
    c = sync_client(sys.argv[1], {"Authorization": "Bearer x"})
    assert c.get("/").text == "ok"      # the pool's connection, left to the exit
    c.close()
""")


class Ok(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def do_GET(self):
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.send_response(200)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"ok")

    do_POST = do_GET


def test_the_sdk_closes_its_kept_alive_connections_at_exit(tmp_path):
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Ok)
    srv.daemon_threads = True
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        script = tmp_path / "client.py"
        script.write_text(CLIENT)
        p = subprocess.run([sys.executable, "-X", "dev", "-W", "always::ResourceWarning",
                            str(script), f"http://127.0.0.1:{srv.server_address[1]}"],
                           capture_output=True, text=True, timeout=60)
    finally:
        srv.shutdown()
        srv.server_close()
    assert p.returncode == 0, p.stderr
    # while it runs, the pool and the fast path each keep one connection for the next
    # call (a client's close, or the end of its `with`, leaves the pool's open); at exit,
    # none is left
    assert p.stdout.split() == ["open", "2", "left", "0"], (p.stdout, p.stderr)
    assert "ResourceWarning" not in p.stderr, p.stderr
