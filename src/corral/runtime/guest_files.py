"""sb.files on a tier whose files live in a guest kernel the host cannot open (microvm):
each call is one command in the sandbox, run as the sandbox's user by the image's python3,
so the guest kernel resolves every path and checks every permission, exactly as for the
sandbox's own code; nothing of the guest's tree is ever opened on the host.

The same calls and answers as runtime/files.py (read, write, write_files, make_dir, list,
info, exists, remove, rename), within the same caps; what comes back from the guest is
parsed strictly (JSON of a known shape, sizes bounded). Not offered here: watch and
write_archive (FilesError naming the tier), and read(format="stream") reads the whole file
first (within caps.read).
"""

from __future__ import annotations

import json
import posixpath

from .files import Caps, EntryInfo, FileNotFound, FilesError, WriteInfo

#: the helper run in the guest: argv[1] the operation, argv[2:] its paths; stdin the data
#: of a write. Answers JSON on stdout (or the file's bytes for a read; for a list, one
#: entry's JSON a line); errors as {"error": strerror, "errno": n} with exit 3.
HELPER = r"""
import json, os, stat, sys
op, args = sys.argv[1], sys.argv[2:]
TYPES = ((stat.S_ISREG, "file"), (stat.S_ISDIR, "dir"), (stat.S_ISLNK, "symlink"),
         (stat.S_ISFIFO, "fifo"), (stat.S_ISSOCK, "socket"), (stat.S_ISCHR, "char_device"),
         (stat.S_ISBLK, "block_device"))
def entry(path, st):
    t = next(n for f, n in TYPES if f(st.st_mode))
    link = os.readlink(path) if t == "symlink" else None
    return [os.path.basename(path) or "/", path, t, st.st_size, stat.S_IMODE(st.st_mode),
            st.st_mtime, link]
try:
    if op == "read":
        cap = int(args[1])
        fd = os.open(args[0], os.O_RDONLY)
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            print(json.dumps({"error": "not a regular file: only regular files are read"}))
            sys.exit(3)
        if st.st_size > cap:
            print(json.dumps({"error": "is %d bytes, over the read cap of %d" % (st.st_size, cap)}))
            sys.exit(3)
        out = sys.stdout.buffer
        while True:
            b = os.read(fd, 65536)
            if not b:
                break
            out.write(b)
        out.flush()
    elif op == "write":
        path = args[0]
        d = os.path.dirname(path) or "/"
        os.makedirs(d, exist_ok=True)
        try:
            mode = stat.S_IMODE(os.lstat(path).st_mode) & 0o1777
        except FileNotFoundError:
            mode = 0o644
        tmp = os.path.join(d, ".corral-write-%d" % os.getpid())
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, mode)
        with os.fdopen(fd, "wb") as f:
            while True:
                b = sys.stdin.buffer.read1(65536)
                if not b:
                    break
                f.write(b)
        os.chmod(tmp, mode)
        os.rename(tmp, path)
        print(json.dumps({"ok": True}))
    elif op == "mkdir":
        made = not os.path.lexists(args[0])
        os.makedirs(args[0], exist_ok=True)
        print(json.dumps({"made": made}))
    elif op == "list":
        top, depth, cap = args[0], int(args[1]), int(args[2])
        out, stack = [], [(top, 1)]
        os.listdir(top)
        while stack:
            d, level = stack.pop()
            try:
                names = os.listdir(d)
            except OSError:
                continue
            for n in names:
                p = os.path.join(d, n)
                try:
                    st = os.lstat(p)
                except FileNotFoundError:
                    continue
                out.append(entry(p, st))
                if len(out) > cap:
                    print(json.dumps({"error": "holds more than %d entries: list a narrower "
                                      "path or a smaller depth" % cap}))
                    sys.exit(3)
                if level < depth and stat.S_ISDIR(st.st_mode) and not p.startswith(("/proc/", "/sys/")):
                    stack.append((p, level + 1))
        sys.stdout.write("".join(json.dumps(e) + "\n" for e in out))
    elif op == "info":
        print(json.dumps({"entry": entry(args[0], os.lstat(args[0]))}))
    elif op == "remove":
        p = args[0]
        if os.path.isdir(p) and not os.path.islink(p):
            import shutil
            shutil.rmtree(p)
        else:
            os.unlink(p)
        print(json.dumps({"ok": True}))
    elif op == "rename":
        os.rename(args[0], args[1])
        print(json.dumps({"entry": entry(args[1], os.lstat(args[1]))}))
except OSError as e:
    print(json.dumps({"error": e.strerror or str(e), "errno": e.errno}))
    sys.exit(3)
"""
#: bytes of JSON an answer of one entry or none may come back as (an entry is at most
#: about 51 KiB: a name of 255 bytes, a path and a link target of 4096, each byte of them
#: six as a JSON escape at worst)
ANSWER_MAX = 256 << 10
#: a listing's line (one entry) at most, in bytes, and what a listing may take on average
#: per entry of caps.entries (a path of ~1000 bytes; a listing of long names may need a
#: narrower path): the whole answer is bounded, and its entries counted, before any of it
#: is parsed
LINE_MAX = 64 << 10
LIST_ENTRY_BYTES = 2 << 10


class GuestFiles:
    """sb.files through commands in the sandbox (see the module's docstring)."""

    def __init__(self, sandbox, cwd: str = "/", caps: Caps | None = None) -> None:
        self._sb, self.cwd, self.caps = sandbox, cwd, caps or Caps()

    def close(self) -> None:
        pass

    def _abs(self, path) -> str:
        if not isinstance(path, str) or "\0" in path or not 0 < len(path) <= 4096:
            raise FilesError("a path is a str of 1-4096 characters without NUL",
                             path=str(path)[:200])
        return posixpath.normpath(posixpath.join(self.cwd, path))

    def _run(self, op: str, *args: str, stdin: bytes | None = None, limit: int = ANSWER_MAX,
             path: str = "") -> bytes:
        out = bytearray()
        over = [False]

        def keep(chunk: bytes) -> None:
            if len(out) + len(chunk) > limit:
                over[0] = True
            else:
                out.extend(chunk)

        r = self._sb.commands.run(["python3", "-I", "-S", "-c", HELPER, op, *args],
                                  stdin=stdin, on_stdout=keep, timeout=120)
        if over[0]:
            raise FilesError(f"the answer from the sandbox was over {limit} bytes", path=path)
        if r.exit_code == 3:
            err = self._answer(bytes(out), path)
            msg = err.get("error")
            errno = err.get("errno") if type(err.get("errno")) is int else None
            cls = FileNotFound if errno == 2 else FilesError
            raise cls(str(msg)[:300] if msg else "failed in the sandbox", path=path,
                      errno=errno)
        if r.verdict != "ok":
            raise FilesError(f"the sandbox's helper ended: {r.verdict} "
                             f"{r.stderr.strip()[-200:]}", path=path)
        return bytes(out)

    @staticmethod
    def _answer(data: bytes, path: str) -> dict:
        try:
            got = json.loads(data.decode("utf-8"))
        except (UnicodeDecodeError, ValueError, RecursionError):   # [[[[... is no ValueError
            raise FilesError("the sandbox's answer was not JSON", path=path) from None
        if not isinstance(got, dict):
            raise FilesError("the sandbox's answer was not an object", path=path)
        return got

    @staticmethod
    def _entry(e, path: str) -> EntryInfo:
        types = ("file", "dir", "symlink", "fifo", "socket", "char_device", "block_device")
        if not (isinstance(e, list) and len(e) == 7 and all(isinstance(x, str) for x in e[:2])
                and e[2] in types and type(e[3]) is int and type(e[4]) is int
                and type(e[5]) in (int, float) and (e[6] is None or isinstance(e[6], str))):
            raise FilesError("the sandbox's answer had a malformed entry", path=path)
        return EntryInfo(*e)

    # -- the API --------------------------------------------------------------------------
    def read(self, path: str, format: str = "text"):
        if format not in ("text", "bytes", "stream"):
            raise FilesError(f'format {format!r} is not "text", "bytes" or "stream"',
                             path=str(path))
        p = self._abs(path)
        data = self._run("read", p, str(self.caps.read), limit=self.caps.read, path=p)
        if format == "stream":
            return iter([data] if data else [])
        return data if format == "bytes" else data.decode("utf-8", errors="replace")

    def write(self, path: str, data, *, extract: bool = False) -> WriteInfo:
        p = self._abs(path)
        if extract:
            return self.write_archive(p, data)
        if isinstance(data, str):
            data = data.encode()
        elif hasattr(data, "read"):
            data = data.read(self.caps.write + 1)
            data = data.encode() if isinstance(data, str) else data
        data = bytes(data)
        if len(data) > self.caps.write:
            raise FilesError(f"{len(data)} bytes is over the write cap of {self.caps.write}: "
                             "nothing written", path=p)
        self._run("write", p, stdin=data, path=p)
        return WriteInfo(posixpath.basename(p), p)

    def write_files(self, files) -> list[WriteInfo]:
        out = []
        for f in files:
            path, data = (f["path"], f["data"]) if isinstance(f, dict) else f
            out.append(self.write(path, data))
        return out

    def make_dir(self, path: str) -> bool:
        p = self._abs(path)
        return bool(self._answer(self._run("mkdir", p, path=p), p).get("made"))

    def list(self, path: str = ".", depth: int = 1) -> list[EntryInfo]:
        from .files import MAX_DEPTH

        if not isinstance(depth, int) or not 1 <= depth <= MAX_DEPTH:
            raise FilesError(f"depth is a whole number from 1 to {MAX_DEPTH}", path=str(path))
        p = self._abs(path)
        cap = self.caps.entries
        data = self._run("list", p, str(depth), str(cap), path=p,
                         limit=LINE_MAX + cap * LIST_ENTRY_BYTES)
        return sorted(self._entries(data, cap, p), key=lambda e: e.path)

    @classmethod
    def _entries(cls, data: bytes, cap: int, path: str) -> list[EntryInfo]:
        """A listing's answer, one entry a line: counted and each line's size checked
        before any is parsed, then parsed a line at a time."""
        if data and not data.endswith(b"\n"):
            raise FilesError("the sandbox's answer was cut short", path=path)
        if data.count(b"\n") > cap:
            raise FilesError(f"the sandbox's answer had more than {cap} entries", path=path)
        lines = data.split(b"\n")[:-1]
        if any(len(line) > LINE_MAX for line in lines):
            raise FilesError("the sandbox's answer had an entry over "
                             f"{LINE_MAX} bytes", path=path)
        out = []
        for line in lines:
            try:
                e = json.loads(line.decode("utf-8"))
            except (UnicodeDecodeError, ValueError, RecursionError):
                raise FilesError("the sandbox's answer was not JSON", path=path) from None
            out.append(cls._entry(e, path))
        return out

    def info(self, path: str) -> EntryInfo:
        p = self._abs(path)
        return self._entry(self._answer(self._run("info", p, path=p), p).get("entry"), p)

    def exists(self, path: str) -> bool:
        try:
            self.info(path)
        except FilesError as e:
            if e.errno == 2:
                return False
            raise
        return True

    def remove(self, path: str) -> None:
        p = self._abs(path)
        if p == "/":
            raise FilesError("the root is not removed", path=p)
        self._run("remove", p, path=p)

    def rename(self, old: str, new: str) -> EntryInfo:
        a, b = self._abs(old), self._abs(new)
        return self._entry(self._answer(self._run("rename", a, b, path=a), a).get("entry"), b)

    def watch(self, path: str, *, recursive: bool = False):
        raise FilesError("watching is not offered on the microvm tier (the guest's files "
                         "are not the host's); poll with list()", path=str(path))

    def write_archive(self, path: str, tar) -> WriteInfo:
        raise FilesError("archives are not unpacked on the microvm tier yet; write the "
                         "files one by one", path=str(path))


__all__ = ["GuestFiles"]
