"""Bearer tokens for `corral serve`, stored hashed in corral's state directory.

    STATE/service/tokens.json   {"tokens": [{name, id, sha256, created, ceiling,
                                             max_sandboxes, max_concurrent, rate, burst,
                                             revoked, apply_changes, admin}]}   mode 0600

A token's sandboxes belong to the token, not to its name: `owner` is the name with the
token's own random id, so a token made again under a revoked one's name is another owner
and never reaches the revoked token's sandboxes. (A record written before ids existed
takes its id from its sha256.)

A token is "corral_" and 32 random bytes in URL-safe base64: high entropy, so one sha256 is
as good as a slow hash and lets the service look a token up at once. Only the hash is
written; the token itself is printed once by `corral token create` and never logged.
`verify` compares hashes with hmac.compare_digest. STATE is $CORRAL_STATE_DIR (or
--state-dir), else /var/lib/corral for root, else ~/.local/share/corral, like the image
store. The file is replaced atomically (a temporary file in the same directory, fsync,
rename) under an flock, and opened with O_NOFOLLOW: a link planted in its place is refused,
never followed.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import re
import secrets
import time

from ..errors import CorralError, UsageError


class StateWriteError(CorralError):
    """The state directory refused a write (full, read-only, a quota): the file there is
    as it was before the call (the write goes to a temporary file first)."""

    kind = "state"
    exit_code = 74      # sysexits' EX_IOERR


NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,62}")
PREFIX = "corral_"
FILE_MAX = 16 << 20


def state_dir(explicit: str | None = None) -> str:
    if explicit:
        return os.path.abspath(explicit)
    from ..images.store import state_dir as default

    return default()


def digest(token: str) -> str:
    return hashlib.sha256(token.encode("utf-8", "surrogatepass")).hexdigest()


#: the limits a token may set; those it leaves unset take the server config's [limits]
LIMITS = ("max_sandboxes", "max_concurrent", "rate", "burst")


class Token:
    """One token's record (never the token itself). `defaults`: the server's [limits] for
    those the record leaves unset (the record on disk keeps only its own)."""

    def __init__(self, d: dict, defaults: dict | None = None) -> None:
        self.name: str = d["name"]
        self.sha256: str = d["sha256"]
        #: this token's own id, made with it: never reused by a token of the same name
        self.id: str = d.get("id") or self.sha256[:16]
        self.created: float = d.get("created", 0.0)
        #: the ceiling policy as a dict in the TOML layout ({}: corral's defaults)
        self.ceiling: dict = d.get("ceiling") or {}
        self.own = {k: d.get(k) for k in LIMITS}
        eff = {k: (v if v is not None else (defaults or {}).get(k)) for k, v in self.own.items()}
        if self.own["rate"] is not None and self.own["burst"] is None:
            eff["burst"] = None          # a token's own rate with the burst it implies
        self.max_sandboxes: int | None = eff["max_sandboxes"]
        self.max_concurrent: int | None = eff["max_concurrent"]
        #: requests a second (None: no limit) and the bucket's size
        self.rate: float | None = eff["rate"]
        self.burst: int | None = eff["burst"]
        self.revoked: bool = bool(d.get("revoked"))
        #: may apply a review-mode sandbox's changes to the host (corral token create
        #: --apply-changes); an agent's token should not
        self.apply_changes: bool = d.get("apply_changes") is True
        #: sees every token's runs, denials and live sandboxes in the audit queries and
        #: the dashboard (corral token create --admin); it controls only its own sandboxes
        self.admin: bool = d.get("admin") is True
        #: seconds a sandbox of this token may live from its creation, whatever timeout
        #: it asks for or sets later (corral token create --max-lifetime; None: 7 days a
        #: call, renewable without end)
        self.max_lifetime: float | None = d.get("max_lifetime")

    @property
    def owner(self) -> str:
        """The key its sandboxes are held under (service/registry.py): "NAME/ID"."""
        return f"{self.name}/{self.id}"

    def to_dict(self) -> dict:
        return {"name": self.name, "id": self.id, "sha256": self.sha256, "created": self.created,
                "ceiling": self.ceiling, **self.own, "revoked": self.revoked,
                "apply_changes": self.apply_changes, "admin": self.admin,
                "max_lifetime": self.max_lifetime}

    def ceiling_policy(self):
        from ..policy.load import policy_from_dict

        return policy_from_dict(self.ceiling, allow_literal=False)


def lifetime(token, seconds: float, born: float | None = None) -> None:
    """Exceeds (403 naming `timeout`) when a sandbox made at `born` (None: now) would
    live past the token's max_lifetime by ending `seconds` from now."""
    from .ceiling import Exceeds

    most = getattr(token, "max_lifetime", None)
    if most is None:
        return
    now = time.time()
    left = (born if born is not None else now) + most - now
    if seconds > left + 0.001:
        raise Exceeds("timeout", f"{seconds:g}s from now is past this token's max "
                      f"lifetime of {most:g}s from the sandbox's creation ({max(left, 0):.0f}s "
                      "left)")


def within_lifetime(token, seconds: float) -> float:
    """A default timeout (one the request did not ask for) cut to the token's max_lifetime,
    as an MCP sandbox's is: only a timeout asked for past the bound is refused."""
    most = getattr(token, "max_lifetime", None)
    return seconds if most is None else min(seconds, most)


class TokenStore:
    def __init__(self, state: str | None = None, defaults: dict | None = None) -> None:
        self.dir = os.path.join(state_dir(state), "service")
        self.path = os.path.join(self.dir, "tokens.json")
        self.defaults = dict(defaults or {})
        self._cache: tuple[tuple, list[Token]] | None = None

    def _ensure(self) -> None:
        os.makedirs(self.dir, 0o700, exist_ok=True)
        st = os.lstat(self.dir)
        import stat

        if not stat.S_ISDIR(st.st_mode):
            raise UsageError(f"{self.dir} is not a directory (a link?): refusing it",
                             field="--state-dir")
        os.chmod(self.dir, 0o700)

    def _lock(self):
        import fcntl

        try:
            self._ensure()
            fd = os.open(os.path.join(self.dir, ".tokens.lock"),
                         os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
        except OSError as e:
            raise StateWriteError(f"cannot create {self.dir}/.tokens.lock: {e.strerror} "
                                  f"(free space there, or point --state-dir elsewhere)",
                                  field="--state-dir") from None
        fcntl.flock(fd, fcntl.LOCK_EX)
        return fd

    def load(self) -> list[Token]:
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
        except FileNotFoundError:
            return []
        except OSError as e:
            raise UsageError(f"cannot read {self.path}: {e.strerror} (a link is refused)",
                             field="--state-dir") from None
        with os.fdopen(fd, "rb") as f:
            raw = f.read(FILE_MAX + 1)
        if len(raw) > FILE_MAX:
            raise UsageError(f"{self.path} is over {FILE_MAX} bytes", field="--state-dir")
        try:
            data = json.loads(raw)
            return [Token(d, self.defaults) for d in data["tokens"]]
        except (ValueError, KeyError, TypeError):
            raise UsageError(f"{self.path} is not a corral token file", field="--state-dir") \
                from None

    def _save(self, tokens: list[Token]) -> None:
        """Replace the file (see the module's docstring); a write the disk refuses leaves it
        as it was and says so in one line (StateWriteError)."""
        try:
            self._replace(tokens)
        except OSError as e:
            raise StateWriteError(f"cannot write {self.path}: {e.strerror}; the tokens there "
                                  f"are unchanged (free space in {self.dir}, or point "
                                  f"--state-dir elsewhere)", field="--state-dir") from None

    def _replace(self, tokens: list[Token]) -> None:
        tmp = os.path.join(self.dir, f".tokens.{os.getpid()}.{secrets.token_hex(4)}.tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC | os.O_NOFOLLOW,
                     0o600)
        try:
            with os.fdopen(fd, "w") as f:
                json.dump({"tokens": [t.to_dict() for t in tokens]}, f, indent=1)
                f.write("\n")
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self.path)   # rename replaces a link itself, never its target
        except BaseException:
            try:
                os.unlink(tmp)
            except FileNotFoundError:
                pass
            raise

    def create(self, name: str, *, ceiling: dict | None = None,
               max_sandboxes: int | None = None, max_concurrent: int | None = None,
               rate: float | None = None, burst: int | None = None,
               apply_changes: bool = False, admin: bool = False,
               max_lifetime: float | None = None) -> str:
        """Record a new token and return it (the only time it exists in clear)."""
        if not isinstance(name, str) or not NAME_RE.fullmatch(name):
            raise UsageError(f"{name!r} is not a token name: letters, digits, '.', '_', '-', "
                             "at most 63", field="--name")
        for field, v in (("--max-sandboxes", max_sandboxes), ("--max-concurrent",
                                                                 max_concurrent)):
            if v is not None and (not isinstance(v, int) or v < 1):
                raise UsageError("must be a whole number of at least 1", field=field)
        if max_lifetime is not None and (isinstance(max_lifetime, bool) or not isinstance(
                max_lifetime, (int, float)) or not 1 <= max_lifetime <= 7 * 86400):
            raise UsageError("a lifetime from 1s to 7d, e.g. --max-lifetime 2h",
                             field="--max-lifetime")
        if burst is not None and rate is None:
            raise UsageError("a burst needs a rate: --rate N/s --burst B", field="--burst")
        if rate is not None:
            from .limits import check_burst, parse_rate

            rate = parse_rate(rate)
            if burst is not None:
                check_burst(burst)
        token = PREFIX + secrets.token_urlsafe(32)
        fd = self._lock()
        try:
            tokens = self.load()
            if any(t.name == name and not t.revoked for t in tokens):
                raise UsageError(f"a token named {name!r} exists; revoke it first or pick "
                                 "another name", field="--name")
            tokens = [t for t in tokens if t.name != name]
            tokens.append(Token({"name": name, "id": secrets.token_hex(8),
                                 "sha256": digest(token), "created": time.time(),
                                 "ceiling": ceiling or {}, "max_sandboxes": max_sandboxes,
                                 "max_concurrent": max_concurrent, "rate": rate,
                                 "burst": burst, "apply_changes": bool(apply_changes),
                                 "admin": bool(admin), "max_lifetime": max_lifetime}))
            self._save(tokens)
        finally:
            os.close(fd)
        return token

    def revoke(self, name: str) -> None:
        fd = self._lock()
        try:
            tokens = self.load()
            hit = [t for t in tokens if t.name == name and not t.revoked]
            if not hit:
                raise UsageError(f"no live token named {name!r}; corral token ls lists them",
                                 field="NAME")
            for t in hit:
                t.revoked = True
            self._save(tokens)
        finally:
            os.close(fd)

    def current(self) -> list[Token]:
        """The tokens as the file says now: read again whenever its lstat (device, inode,
        size, times) differs from the last read's. Every change replaces the file (a new
        inode: _save), so a revocation shows at once; a link planted there is refused by
        load() as ever (an lstat never matches a regular file's)."""
        try:
            st = os.lstat(self.path)
            key = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns,
                   st.st_mode)
        except OSError:
            key = None
        cached = self._cache
        if key is not None and cached is not None and cached[0] == key:
            return cached[1]
        tokens = self.load()
        self._cache = (key, tokens) if key is not None else None
        return tokens

    def verify(self, token: str) -> Token | None:
        """The live token record `token` belongs to, or None. The file is looked at each
        time (current()), so a revocation takes effect on the next request."""
        if not isinstance(token, str) or not token.startswith(PREFIX) or len(token) > 256:
            return None
        want = digest(token)
        found = None
        for t in self.current():
            if hmac.compare_digest(t.sha256, want) and not t.revoked:
                found = t
        return found
