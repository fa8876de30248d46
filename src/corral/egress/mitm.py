"""The per-run certificate authority that lets the proxy read HTTPS to granted hosts.

The supervisor calls `make_ca()` once per run, passes both halves to the proxy in
``NetConfig.ca_cert_pem`` / ``ca_key_pem`` (a memfd, never a file or an argument), and gives
the sandbox only the certificate (in the trust bundle named by SSL_CERT_FILE and friends).
The key never enters the sandbox, and it dies with the run: it signs leaves for one day at
most.

The proxy builds one `LeafCache` from them and calls `server_context(host)` when it
terminates TLS for a granted host: a leaf certificate for exactly that name (or address) is
minted on first use and kept (least recently used first out beyond ``max_hosts``). Leaves
are EC P-256, ``CA:FALSE``, serverAuth, valid until the CA expires or for a day, whichever
comes first. Hosts that no grant names are never terminated: they stay plain tunnels and
never see this CA.

Pure apart from one thing: `ssl.SSLContext.load_cert_chain` only reads files, so a leaf
goes through an anonymous memfd (``/proc/self/fd/N``), never through the file system.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
import ssl
from collections import OrderedDict

#: ALPN for the sandbox's side of a terminated connection: the proxy speaks HTTP/1.1 only
ALPN = ["http/1.1"]


def make_ca(common_name: str = "corral run CA") -> tuple[str, str]:
    """A fresh CA for one run: (certificate PEM, private key PEM). EC P-256, valid for one
    day (from five minutes ago, for clock skew), ``CA:TRUE, pathlen:0``, key usage
    keyCertSign + cRLSign only."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, "corral"),
                      x509.NameAttribute(NameOID.COMMON_NAME, common_name[:64] or "corral")])
    now = datetime.datetime.now(datetime.UTC)
    ski = x509.SubjectKeyIdentifier.from_public_key(key.public_key())
    cert = (x509.CertificateBuilder()
            .subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=False, content_commitment=False,
                                         key_encipherment=False, data_encipherment=False,
                                         key_agreement=False, key_cert_sign=True, crl_sign=True,
                                         encipher_only=False, decipher_only=False), critical=True)
            .add_extension(ski, critical=False)
            .sign(key, hashes.SHA256()))
    cert_pem = cert.public_bytes(serialization.Encoding.PEM).decode("ascii")
    key_pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                serialization.NoEncryption()).decode("ascii")
    return cert_pem, key_pem


class LeafCache:
    """Leaf certificates signed by the run CA, one per host, and a server SSLContext each.

    Raises ValueError (TypeError for a non-EC key) at construction when the PEMs do not
    parse or do not match; messages never contain key material."""

    def __init__(self, ca_cert_pem: str, ca_key_pem: str, *, max_hosts: int = 256) -> None:
        from cryptography import x509
        from cryptography.hazmat.primitives import serialization
        from cryptography.hazmat.primitives.asymmetric import ec

        try:
            self._ca = x509.load_pem_x509_certificate(ca_cert_pem.encode("ascii"))
        except ValueError:
            raise ValueError("ca_cert_pem is not a PEM certificate") from None
        try:
            key = serialization.load_pem_private_key(ca_key_pem.encode("ascii"), password=None)
        except (ValueError, TypeError):
            raise ValueError("ca_key_pem is not an unencrypted PEM private key") from None
        if key.public_key() != self._ca.public_key():
            raise ValueError("ca_key_pem does not belong to ca_cert_pem")
        if not isinstance(key, ec.EllipticCurvePrivateKey):
            raise TypeError("the run CA must use an EC key (mitm.make_ca makes one)")
        self._key = key
        #: one key for every leaf of this proxy: minting is then one signature, not a keygen
        self._leaf_key = ec.generate_private_key(ec.SECP256R1())
        self._leaf_key_pem = self._leaf_key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption())
        self._max = max_hosts
        self._contexts: OrderedDict[str, ssl.SSLContext] = OrderedDict()

    def server_context(self, host: str) -> ssl.SSLContext:
        """A server-side context presenting a leaf for `host` (a canonical name, or an IP
        address in standard notation). TLS 1.2+, ALPN http/1.1 only."""
        ctx = self._contexts.get(host)
        if ctx is not None:
            self._contexts.move_to_end(host)
            return ctx
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        ctx.set_alpn_protocols(ALPN)
        _load_chain(ctx, self.mint(host) + self._leaf_key_pem)
        self._contexts[host] = ctx
        if len(self._contexts) > self._max:
            self._contexts.popitem(last=False)
        return ctx

    def mint(self, host: str) -> bytes:
        """The PEM of a new leaf certificate for `host`, signed by the run CA."""
        from cryptography import x509
        from cryptography.hazmat.primitives import hashes, serialization
        from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

        try:
            san: x509.GeneralName = x509.IPAddress(ipaddress.ip_address(host))
        except ValueError:
            san = x509.DNSName(host)
        now = datetime.datetime.now(datetime.UTC)
        end = min(now + datetime.timedelta(days=1), self._ca.not_valid_after_utc)
        cert = (x509.CertificateBuilder()
                .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME,
                                                            host[:64] or "corral")]))
                .issuer_name(self._ca.subject)
                .public_key(self._leaf_key.public_key())
                .serial_number(x509.random_serial_number())
                .not_valid_before(now - datetime.timedelta(minutes=5))
                .not_valid_after(end)
                .add_extension(x509.SubjectAlternativeName([san]), critical=False)
                .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
                .add_extension(x509.KeyUsage(digital_signature=True, content_commitment=False,
                                             key_encipherment=False, data_encipherment=False,
                                             key_agreement=False, key_cert_sign=False,
                                             crl_sign=False, encipher_only=False,
                                             decipher_only=False), critical=True)
                .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]),
                               critical=False)
                .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(
                    self._key.public_key()), critical=False)
                .sign(self._key, hashes.SHA256()))
        return cert.public_bytes(serialization.Encoding.PEM)


def _load_chain(ctx: ssl.SSLContext, pem: bytes) -> None:
    """load_cert_chain from memory: through a memfd, since it only takes a path."""
    fd = os.memfd_create("corral-leaf", os.MFD_CLOEXEC)
    try:
        os.write(fd, pem)
        ctx.load_cert_chain(f"/proc/self/fd/{fd}")
    finally:
        os.close(fd)


#: the system trust store's context, made once per process (the zygote's, shared by every
#: proxy it forks) with the store file it was read from: (key, context)
_SYSTEM: tuple[tuple, ssl.SSLContext] | None = None


def _system_store_key() -> tuple:
    """What the system trust store's context was read from, as it is now: OpenSSL's CA
    file (SSL_CERT_FILE honoured) by path, inode and change time (None when missing), and
    the CA directory's path (OpenSSL reads its files when it verifies, so they are never
    stale)."""
    paths = ssl.get_default_verify_paths()
    cafile = os.environ.get(paths.openssl_cafile_env) or paths.openssl_cafile
    capath = os.environ.get(paths.openssl_capath_env) or paths.openssl_capath
    try:
        st = os.stat(cafile)
        seen: tuple | None = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
    except OSError:
        seen = None
    return cafile, seen, capath


def upstream_context(cafile: str | None) -> ssl.SSLContext:
    """The client context for the proxy's own TLS to a granted host: the system trust store
    (or `cafile` alone), hostname checking on, TLS 1.2+, ALPN http/1.1.

    The system store's context is made once and kept while its CA file is unchanged (same
    inode, size and times): OpenSSL takes 15 to 30 ms of CPU to parse the 140-odd
    certificates of a distribution's bundle, which every proxy with a grant paid at its
    start, beside the sandbox's own start on the same cores. The zygote makes it before it
    forks (boot.preload). A `cafile` (the policy's upstream_ca, copied per run) is read
    each time."""
    global _SYSTEM
    if cafile:
        return _new_upstream(cafile)
    key = _system_store_key()
    if _SYSTEM is None or _SYSTEM[0] != key:
        _SYSTEM = (key, _new_upstream(None))
    return _SYSTEM[1]


def _new_upstream(cafile: str | None) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=cafile) if cafile else ssl.create_default_context()
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.check_hostname = True
    ctx.verify_mode = ssl.CERT_REQUIRED
    ctx.set_alpn_protocols(ALPN)
    return ctx


__all__ = ["ALPN", "LeafCache", "make_ca", "upstream_context"]
