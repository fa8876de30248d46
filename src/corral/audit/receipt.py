"""Signed receipts: what ran, under which rules, and what came out, signed by this host.

    {"receipt": 1,
     "body": {"run_id", "started", "ended", "tier", "host", "corral_version",
              "actor", "policy": {"sha256"}, "image": digest, "argv": [...],
              "argv_sha256", "stdin_sha256", "stdout_sha256", "stderr_sha256",
              "changes_sha256" (review mode, else null), "egress_sha256",
              "egress": {"allowed": N, "denied": N}, "verdict", "exit_code", "signal",
              "usage"},
     "key": "ed25519:BASE64 (the raw 32-byte public key)",
     "signature": "BASE64 (Ed25519 over the canonical JSON of body)"}

The canonical JSON is json.dumps(body, sort_keys=True, separators=(",", ":"),
ensure_ascii=True). Each hash is "sha256:HEX" of the exact bytes: argv as the canonical
JSON list, the egress log as the canonical JSON list of the run's net and secret events.

The key is per host: STATE/audit/receipt.key, the raw 32-byte Ed25519 private key, 0600,
created on first use: written whole under a temporary name, then linked into place
(never replacing what is there); read with O_NOFOLLOW (a link in its place is refused).
`cryptography` is imported only here, and only when a receipt is made or checked.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import secrets
import stat

VERSION = 1
KEY_FILE = "receipt.key"

#: `corral verify` exit codes (docs/audit.md)
OK, MALFORMED, BAD_SIGNATURE, WRONG_KEY, MISMATCH = 0, 10, 11, 12, 13


class VerifyError(Exception):
    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code


def sha(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


#: json.dumps(v, sort_keys=True, separators=(",", ":"), ensure_ascii=True) made once: dumps
#: with arguments builds an encoder per call (~3 us, three calls a receipt)
_CANONICAL = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=True)


def canonical(v) -> bytes:
    return _CANONICAL.encode(v).encode()


#: the egress_sha256 of a run with no net or secret events: sha(canonical([]))
NO_EGRESS = "sha256:4f53cda18c2baa0c0354bb5f9a3ecbe5ed12ab4d8e11ba873c2f11161202b945"

_POLICY_SHA: dict[str, str] = {}   # policy TOML -> its sha (a batch signs one many times)


def _policy_sha(text: str) -> str:
    known = _POLICY_SHA.get(text)
    if known is None:
        if len(_POLICY_SHA) >= 64:
            _POLICY_SHA.clear()
        known = _POLICY_SHA[text] = sha(text.encode())
    return known


def body(*, run_id, started, ended, tier, policy_toml: str, image_digest: str, argv,
         stdin: bytes | str, stdout: bytes | str, stderr: bytes | str, changes, events,
         verdict, exit_code, signal, usage, actor) -> dict:
    """The receipt body. stdin/stdout/stderr: the bytes, or an already computed
    "sha256:..."."""
    import socket

    egress = [e for e in events if e.get("kind") in ("net", "secret")]
    return {
        "run_id": run_id, "started": started, "ended": ended, "tier": tier,
        "host": socket.gethostname(), "corral_version": corral_version(), "actor": actor,
        "policy_sha256": _policy_sha(policy_toml), "image": image_digest,
        "argv": list(argv), "argv_sha256": sha(canonical(list(argv))),
        "stdin_sha256": stdin if isinstance(stdin, str) else sha(stdin),
        "stdout_sha256": stdout if isinstance(stdout, str) else sha(stdout),
        "stderr_sha256": stderr if isinstance(stderr, str) else sha(stderr),
        "changes_sha256": None if changes is None else sha(canonical(changes)),
        "egress_sha256": sha(canonical(egress)) if egress else NO_EGRESS,
        "egress": {"allowed": sum(e.get("decision") == "allow" for e in egress),
                   "denied": sum(e.get("decision") == "deny" for e in egress)},
        "verdict": verdict, "exit_code": exit_code, "signal": signal, "usage": usage,
    }


_VERSION: list[str] = []


def corral_version() -> str:
    """The installed distribution's version (the package face, corral.__version__, is a
    layer above this one); looked up once a process (a batch node signs many)."""
    if not _VERSION:
        try:
            from importlib.metadata import version

            _VERSION.append(version("corral"))
        except Exception:   # noqa: BLE001 - not installed: a source tree
            _VERSION.append("unknown")
    return _VERSION[0]


def key_dir() -> str:
    from .record import db_path

    return os.path.dirname(db_path())


_KEYS: dict[str, tuple] = {}   # directory -> (its key, its public text), once read (the
                               # service and a batch's nodes sign many)


def _private_key(directory: str | None = None):
    return _key_and_text(directory)[0]


def _key_and_text(directory: str | None = None) -> tuple:
    """(the private key, "ed25519:BASE64" of its public half): deriving and encoding the
    public key cost each receipt ~60 us, ~15 % of a batch job's signing."""
    d = directory or key_dir()
    known = _KEYS.get(d)
    if known is None:
        key = _load_key(d)
        known = _KEYS[d] = (key, "ed25519:" + base64.b64encode(_raw_public(key)).decode())
    return known


def _load_key(directory: str):
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    from .store import private_dir

    d = private_dir(directory)
    path = os.path.join(d, KEY_FILE)
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        fd = os.open(path, flags)
    except FileNotFoundError:
        return _create_key(d, path)
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o077:
            raise PermissionError(f"{path} must be a 0600 file of this user: refused")
        raw = f.read(33)
    if len(raw) != 32:
        raise ValueError(f"{path} is not a raw 32-byte Ed25519 key")
    return Ed25519PrivateKey.from_private_bytes(raw)


def _create_key(d: str, path: str):
    """A new key, written whole under a name of this process's own and then linked into
    place: a process that finds the key file finds all 32 bytes of it (the O_EXCL create
    of the file itself let a second node read it empty and sign nothing). When another
    process links first, its key is the host's and this one is dropped."""
    from cryptography.hazmat.primitives import serialization as s
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    key = Ed25519PrivateKey.generate()
    raw = key.private_bytes(s.Encoding.Raw, s.PrivateFormat.Raw, s.NoEncryption())
    tmp = os.path.join(d, f".{KEY_FILE}.{os.getpid()}.{secrets.token_hex(4)}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                 0o600)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(raw)
            f.flush()
            os.fsync(f.fileno())
        try:
            os.link(tmp, path)      # never replaces: an existing key (or link) stays
        except FileExistsError:
            return _load_key(d)
    finally:
        os.unlink(tmp)
    return key


def _raw_public(key) -> bytes:
    from cryptography.hazmat.primitives import serialization as s

    return key.public_key().public_bytes(s.Encoding.Raw, s.PublicFormat.Raw)


def public_key_text(directory: str | None = None) -> str:
    """This host's public key as `corral key show` prints it: "ed25519:BASE64"."""
    return _key_and_text(directory)[1]


def sign(b: dict, directory: str | None = None) -> dict:
    key, text = _key_and_text(directory)
    return {"receipt": VERSION, "body": b, "key": text,
            "signature": base64.b64encode(key.sign(canonical(b))).decode()}


def parse_key(text: str) -> bytes:
    text = text.strip()
    if not text.startswith("ed25519:"):
        raise VerifyError(MALFORMED, "a key is \"ed25519:BASE64\" (as corral key show "
                                     "prints it)")
    try:
        raw = base64.b64decode(text[8:], validate=True)
    except ValueError:
        raw = b""
    if len(raw) != 32:
        raise VerifyError(MALFORMED, "the key is not 32 bytes of base64 after \"ed25519:\"")
    return raw


RECEIPT_MAX = 4 << 20
#: how deep a receipt's objects and lists may nest (one corral makes is 3 deep: the
#: receipt, its body, usage or egress)
DEPTH_MAX = 16


class _Twice(ValueError):
    pass


def _unique(pairs: list) -> dict:
    """json's object_pairs_hook: an object, refused when it names a key twice (json keeps
    the last, other readers the first: one receipt, two readings)."""
    out: dict = {}
    for k, v in pairs:
        if k in out:
            raise _Twice(f"the receipt names the key {k[:64]!r} twice in one object")
        out[k] = v
    return out


def _depth(v) -> int:
    """How deep `v` nests, walked without recursion, stopping past DEPTH_MAX."""
    deepest, todo = 0, [(v, 1)]
    while todo:
        v, d = todo.pop()
        if isinstance(v, (dict, list)):
            deepest = max(deepest, d)
            if d > DEPTH_MAX:
                break
            todo.extend((c, d + 1) for c in (v.values() if isinstance(v, dict) else v))
    return deepest


def load(data: bytes) -> dict:
    """A receipt's JSON, parsed strictly: over RECEIPT_MAX bytes, not JSON, a key twice
    in one object, nesting past DEPTH_MAX or a field missing is MALFORMED."""
    if len(data) > RECEIPT_MAX:
        raise VerifyError(MALFORMED, f"the receipt is over {RECEIPT_MAX} bytes")
    try:
        r = json.loads(data, object_pairs_hook=_unique)
    except _Twice as e:
        raise VerifyError(MALFORMED, str(e)) from None
    except RecursionError:      # [[[[... past the interpreter's stack: not a ValueError
        raise VerifyError(MALFORMED, f"the receipt nests deeper than {DEPTH_MAX} levels"
                          ) from None
    except ValueError as e:
        raise VerifyError(MALFORMED, f"the receipt is not JSON ({e})") from None
    if _depth(r) > DEPTH_MAX:
        raise VerifyError(MALFORMED, f"the receipt nests deeper than {DEPTH_MAX} levels")
    if not isinstance(r, dict) or r.get("receipt") != VERSION or not isinstance(
            r.get("body"), dict) or not isinstance(r.get("key"), str) or not isinstance(
            r.get("signature"), str):
        raise VerifyError(MALFORMED, f"not a corral receipt (version {VERSION}: receipt, "
                                     "body, key, signature)")
    return r


def verify(r: dict, trusted: bytes, files: dict[str, bytes]) -> dict:
    """Check a loaded receipt against the trusted public key and the files handed in
    ({"stdout": bytes, ...}). Returns the body; raises VerifyError with its exit code."""
    from cryptography.exceptions import InvalidSignature
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

    if parse_key(r["key"]) != trusted:
        raise VerifyError(WRONG_KEY, f"the receipt was signed by {r['key'][:20]}..., not "
                                     "the trusted key (corral key show on the host that "
                                     "ran it; --key KEY)")
    try:
        sig = base64.b64decode(r["signature"], validate=True)
        Ed25519PublicKey.from_public_bytes(trusted).verify(sig, canonical(r["body"]))
    except (InvalidSignature, ValueError):
        raise VerifyError(BAD_SIGNATURE, "the signature does not match the receipt's body: "
                                         "the receipt was altered") from None
    b = r["body"]
    for name, data in files.items():
        want = b.get(f"{name}_sha256")
        if want != sha(data):
            raise VerifyError(MISMATCH, f"--{name}: the file's sha256 is not the "
                                        f"receipt's {name}_sha256 ({want})")
    return b
