"""E2B_DOMAIN mode over TLS: the official SDK with only E2B_DOMAIN and E2B_API_KEY set (no
URL variables) talks to https://api.DOMAIN and https://PORT-ID.DOMAIN. Here `corral serve
--tls-cert/--tls-key` serves a wildcard certificate for *.corral.test from a CA the test
makes (cryptography); the SDK runs in a subprocess under `unshare -m` with a private
/etc/hosts bind-mounted over the host's, mapping the names to 127.0.0.1 (the host's own
file is never touched), and trusts the CA through SSL_CERT_FILE, which httpx honours.

/etc/hosts has no wildcards (and the SDK's data-plane client, in Rust, reads it once), so
one client process creates the sandboxes (api.DOMAIN only), the test then writes their
names (49983-ID and 49999-ID, what a wildcard DNS record would answer) into the private
file, and a second process connects to them and drives the data plane. The server listens on a free port, not 443 (shared host), so
E2B_DOMAIN carries it: "corral.test:PORT" (the SDK appends the domain to each host name
whole, so every URL keeps the port)."""

import datetime
import json
import os
import shutil
import subprocess
import sys
import time

import httpx
import pytest
from conftest import CORRAL, tier_unavailable
from servefix import free_port as _free_port
from servefix import make_token as _token

pytest.importorskip("e2b_code_interpreter")

pytestmark = [
    pytest.mark.skipif(tier_unavailable("namespace") is not None,
                       reason=f"namespace tier: {tier_unavailable('namespace')}"),
    pytest.mark.skipif(os.geteuid() != 0 or shutil.which("unshare") is None,
                       reason="a private /etc/hosts needs root and unshare(1)"),
]

DOMAIN = "corral.test"

#: step 1, control plane only (api.DOMAIN): two sandboxes, their ids printed
CREATE = r'''
import asyncio, json, os, sys
from e2b_code_interpreter import AsyncSandbox, Sandbox

async def acreate():
    return (await AsyncSandbox.create(timeout=120)).sandbox_id
print(json.dumps([Sandbox.create(timeout=120).sandbox_id, asyncio.run(acreate())]))
sys.stdout.flush()
os._exit(0)    # the SDK's Rust client can abort in interpreter teardown (SIGABRT)
'''

#: step 2, with both sandboxes' names resolvable: the data plane, sync and async
USE = r'''
import asyncio, json, os, sys
from e2b_code_interpreter import AsyncSandbox, Sandbox

sid, aid = sys.argv[1:3]
out = {}
sb = Sandbox.connect(sid)
out["envd_url"] = sb.envd_api_url
out["run"] = sb.commands.run("echo over-tls").stdout
sb.files.write("/tmp/t.txt", "tls file")
out["read"] = sb.files.read("/tmp/t.txt")
out["code"] = sb.run_code("6 * 7").text
out["listed"] = sid in [s.sandbox_id for s in Sandbox.list().next_items()]
sb.kill()

async def main():
    a = await AsyncSandbox.connect(aid)
    try:
        return (await a.commands.run("echo async-tls")).stdout
    finally:
        await a.kill()
out["async"] = asyncio.run(main())
print(json.dumps(out))
sys.stdout.flush()
os._exit(0)    # as above
'''


def _ca_and_wildcard(tmp):
    """A CA of the test's own and a certificate it signed for *.corral.test, corral.test
    and 127.0.0.1 (the readiness probe)."""
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    now = datetime.datetime.now(datetime.UTC)

    def cert(subject, issuer, pub, key, exts):
        b = (x509.CertificateBuilder().subject_name(subject).issuer_name(issuer)
             .public_key(pub).serial_number(x509.random_serial_number())
             .not_valid_before(now - datetime.timedelta(hours=1))
             .not_valid_after(now + datetime.timedelta(days=1)))
        for e, crit in exts:
            b = b.add_extension(e, critical=crit)
        return b.sign(key, hashes.SHA256())

    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "corral test internal CA")])
    ca = cert(ca_name, ca_name, ca_key.public_key(), ca_key,
              [(x509.BasicConstraints(ca=True, path_length=0), True)])
    key = ec.generate_private_key(ec.SECP256R1())
    leaf = cert(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "*." + DOMAIN)]), ca_name,
                key.public_key(), ca_key,
                [(x509.SubjectAlternativeName([
                    x509.DNSName("*." + DOMAIN), x509.DNSName(DOMAIN),
                    x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), False),
                 (x509.BasicConstraints(ca=False, path_length=None), True)])
    pem = serialization.Encoding.PEM
    (tmp / "ca.pem").write_bytes(ca.public_bytes(pem))
    (tmp / "wild.pem").write_bytes(leaf.public_bytes(pem))
    (tmp / "wild.key").write_bytes(key.private_bytes(
        pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))
    return tmp / "ca.pem", tmp / "wild.pem", tmp / "wild.key"


#: the reverse proxy docs/e2b.md documents (nginx), with the test's own paths and ports
NGINX = """
worker_processes 1;
daemon off;
user root;
pid {tmp}/nginx.pid;
error_log {tmp}/nginx-error.log;
events {{ worker_connections 256; }}
http {{
    access_log off;
    client_body_temp_path {tmp}/nginx-body;
    proxy_temp_path {tmp}/nginx-proxy;
    fastcgi_temp_path {tmp}/nginx-fcgi;
    uwsgi_temp_path {tmp}/nginx-uwsgi;
    scgi_temp_path {tmp}/nginx-scgi;
    server {{
        listen 127.0.0.1:{port} ssl http2;
        server_name {domain} *.{domain};
        ssl_certificate {cert};
        ssl_certificate_key {key};
        client_max_body_size 16m;
        location / {{
            proxy_pass http://127.0.0.1:{upstream};
            proxy_http_version 1.1;
            proxy_set_header Host $host;
            proxy_set_header Connection "";
            proxy_buffering off;
            proxy_request_buffering off;
            proxy_read_timeout 1h;
            proxy_send_timeout 1h;
        }}
    }}
}}
"""


def _wait_up(url, trust, proc, log):
    for _ in range(600):
        try:
            if httpx.get(url + "/health", verify=trust, timeout=5).status_code in (200, 204):
                return
        except httpx.TransportError:
            pass
        assert proc.poll() is None, log.read_text() if log.exists() else "exited"
        time.sleep(0.05)
    raise AssertionError(f"{url} did not come up")


@pytest.mark.parametrize("front", ["direct", "nginx"])
def test_sdk_in_domain_mode_over_tls(tmp_path, front):
    """direct: corral serve --tls-cert/--tls-key; nginx: corral serve on plain HTTP behind
    nginx terminating TLS with the wildcard certificate (docs/e2b.md's configuration)."""
    import ssl

    if front == "nginx" and shutil.which("nginx") is None:
        pytest.skip("nginx is not installed (scripts/setup.sh installs it)")
    ca, cert, key = _ca_and_wildcard(tmp_path)
    trust = ssl.create_default_context(cafile=str(ca))
    state = str(tmp_path / "state")
    token = _token(state, "dom")
    port = _free_port()
    templates = tmp_path / "templates.toml"
    templates.write_text("[base]\n\n[code-interpreter-v1]\n")   # the host's root
    log = open(tmp_path / "serve.log", "wb")
    upstream = _free_port() if front == "nginx" else port
    tls = ["--tls-cert", str(cert), "--tls-key", str(key)] if front == "direct" else []
    procs = [subprocess.Popen([CORRAL, "serve", "--port", str(upstream), "--state-dir",
                               state, *tls], stdout=log, stderr=subprocess.STDOUT,
                              env=dict(os.environ, CORRAL_E2B_DOMAIN=DOMAIN,
                                       CORRAL_E2B_TEMPLATES=str(templates)))]
    try:
        if front == "nginx":
            _wait_up(f"http://127.0.0.1:{upstream}", trust, procs[0], tmp_path / "serve.log")
            conf = tmp_path / "nginx.conf"
            conf.write_text(NGINX.format(tmp=tmp_path, port=port, domain=DOMAIN, cert=cert,
                                         key=key, upstream=upstream))
            procs.append(subprocess.Popen(["nginx", "-c", str(conf), "-p", str(tmp_path)],
                                          stdout=subprocess.DEVNULL,
                                          stderr=subprocess.DEVNULL))
        _wait_up(f"https://127.0.0.1:{port}", trust, procs[-1],
                 tmp_path / ("nginx-error.log" if front == "nginx" else "serve.log"))
        hosts = tmp_path / "hosts"
        hosts.write_text(f"127.0.0.1 localhost\n127.0.0.1 api.{DOMAIN}\n")
        env = {k: v for k, v in os.environ.items()
               if not k.startswith("E2B_") and k not in ("SSL_CERT_DIR", "HTTPS_PROXY",
                                                         "https_proxy", "ALL_PROXY")}
        env.update(E2B_DOMAIN=f"{DOMAIN}:{port}", E2B_API_KEY=token, SSL_CERT_FILE=str(ca),
                   NO_PROXY="*")

        def client(script, *args):
            path = tmp_path / "client.py"
            path.write_text(script)
            p = subprocess.run(
                ["unshare", "-m", "--propagation", "private", "--", "sh", "-c",
                 'mount --bind "$0" /etc/hosts && exec "$@"', str(hosts), sys.executable,
                 str(path), *args],
                capture_output=True, text=True, timeout=300, env=env, check=False)
            assert p.returncode == 0, p.stderr[-3000:]
            return json.loads(p.stdout.splitlines()[-1])

        ids = client(CREATE)
        # what a wildcard record would answer for these sandboxes' host names
        with open(hosts, "a") as f:
            for sid in ids:
                f.write(f"127.0.0.1 49983-{sid}.{DOMAIN} 49999-{sid}.{DOMAIN}\n")
        out = client(USE, *ids)
        assert out["envd_url"] == f"https://49983-{ids[0]}.{DOMAIN}:{port}"
        assert out["run"] == "over-tls\n" and out["read"] == "tls file"
        assert out["code"] == "42" and out["listed"] and out["async"] == "async-tls\n"
        # the host's /etc/hosts never had the test's names
        with open("/etc/hosts") as f:
            assert DOMAIN not in f.read()
        # a plain-HTTP client is not served on the TLS port (uvicorn drops it; nginx
        # answers 400, "plain HTTP request was sent to HTTPS port")
        try:
            r = httpx.get(f"http://127.0.0.1:{port}/health", timeout=5)
            assert front == "nginx" and r.status_code == 400, r.text
        except httpx.TransportError:
            assert front == "direct"
    finally:
        for proc in reversed(procs):
            proc.terminate()
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        log.close()
