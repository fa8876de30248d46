"""The `corral` launcher and its run-path file: `corral run`'s modules compiled into one file.

    .venv/bin/python -m corral._runpath LAUNCHER RUNPATH SRC SITE   (scripts/setup.sh)

writes LAUNCHER (.venv/bin/corral) and RUNPATH (.venv/corral-runpath): the modules a fresh
`corral run` imports from source files (corral's own, and `__future__`, which their first
`from __future__ import annotations` loads; found by importing the run path in a fresh
interpreter started as the launcher starts it), each compiled from its source, with the
source's path, size and mtime, in one marshal file headed by this Python's bytecode magic
number.

The launcher reads that file once and puts a finder first on sys.meta_path; a module it
holds is loaded from it when its source file still has the size and mtime (ns) it was
compiled from, else (or for any module it does not hold) the usual import runs. It saves
what importing a module from its own .pyc costs beyond running the code: the directory
stat and listing lookups, a stat of the candidate file, the .pyc's open, fstat, read and
checks (~30 us a module, ~1 ms of the 29 modules; docs/architecture.md). The file is
used only when it is a regular file of root or of this user that no one else may write
(as the .venv it lives in) and made by this Python (magic number); anything odd: the
usual import. A stale file is harmless: each changed module falls back on its own, and
`scripts/setup.sh` rewrites the file.
"""

from __future__ import annotations

import marshal
import os
import subprocess
import sys

#: what `corral run` imports at start (cli.py, then the sandbox, then the namespace tier);
#: every corral module that loads with them goes in the file
ENTRY_MODULES = ("corral.cli", "corral.runtime.sandbox", "corral.backends.namespace",
                 "corral.audit.record")

#: the launcher's finder, compiled into the file; run by the launcher with MODS, the
#: {module name: (source path, is a package, mtime ns, size, marshalled code)} table
FINDER = '''
import marshal, posix, sys
_ext = sys.modules["_frozen_importlib_external"]


class RunPathLoader(_ext.SourceFileLoader):
    """The source file's own loader, but its code comes from the run-path file (once)."""

    def __init__(self, name, path, code):
        super().__init__(name, path)
        self.code = code

    def get_code(self, fullname):
        code, self.code = self.code, None
        if code is None or fullname != self.name:
            return super().get_code(fullname)
        return marshal.loads(code)


class RunPathFinder:
    @staticmethod
    def find_spec(name, path=None, target=None):
        entry = MODS.get(name)
        if entry is None:
            return None
        file, is_pkg, mtime_ns, size, code = entry
        try:
            st = posix.stat(file)
        except OSError:
            return None
        if st.st_mtime_ns != mtime_ns or st.st_size != size:
            return None   # edited since: the usual import (its .py, its .pyc)
        return _ext.spec_from_file_location(
            name, file, loader=RunPathLoader(name, file, code),
            submodule_search_locations=[file.rpartition("/")[0]] if is_pkg else None)


sys.meta_path.insert(0, RunPathFinder)
'''

LAUNCHER = '''#!{python} -IS
import gc, sys
gc.disable()  # corral.cli.gc_back_on() turns it on again
sys.path += [{src!r}, {site!r}]  # after the standard library, as a .pth puts them
try:  # the run path's modules in one file, if ours and this Python's (corral/_runpath.py)
    import marshal, posix
    with open({runpath!r}, "rb") as f:
        st, data = posix.fstat(f.fileno()), f.read()
    if (st.st_uid in (0, posix.geteuid()) and not st.st_mode & 0o022 and st.st_nlink == 1
            and data[:4] == sys.modules["_frozen_importlib_external"].MAGIC_NUMBER):
        code, mods = marshal.loads(memoryview(data)[4:])
        exec(code, {{"MODS": mods}})
except (OSError, ValueError, EOFError, TypeError):
    pass
from corral.cli import entry
entry()
'''


def run_path_modules(python: str, paths: list[str]) -> list[tuple[str, str, bool]]:
    """(name, source file, is a package) of each module a fresh interpreter started like the
    launcher loads from a source file with ENTRY_MODULES, in the order they loaded (frozen,
    built-in and extension modules are not in it, nor what the interpreter loaded before:
    the encodings)."""
    code = (f"import sys; sys.path += {paths!r}; before = set(sys.modules)\n"
            f"import {', '.join(ENTRY_MODULES)}\n"
            "for n, m in [(n, m) for n, m in sys.modules.items() if n not in before]:\n"
            "    s = getattr(m, '__spec__', None)\n"
            "    if s and type(s.loader).__name__ == 'SourceFileLoader' and "
            "s.origin.endswith('.py'):\n"
            "        print(n, s.origin, int(s.submodule_search_locations is not None))")
    out = subprocess.run([python, "-IS", "-c", code], check=True, capture_output=True,
                         text=True, timeout=120).stdout
    return [(n, f, p == "1") for n, f, p in (line.split(" ") for line in out.splitlines())]


def build(python: str, src: str, site: str) -> bytes:
    """The run-path file's bytes: the magic number, then marshal((finder code, MODS))."""
    from importlib.util import MAGIC_NUMBER

    mods = {}
    for name, file, is_pkg in run_path_modules(python, [src, site]):
        with open(file, "rb") as f:
            st = os.fstat(f.fileno())
            source = f.read()
        code = compile(source, file, "exec", dont_inherit=True)
        mods[name] = (file, is_pkg, st.st_mtime_ns, st.st_size, marshal.dumps(code))
    finder = compile(FINDER, "<corral-runpath>", "exec", dont_inherit=True)
    return MAGIC_NUMBER + marshal.dumps((finder, mods))


def _write(path: str, data: bytes, mode: int) -> None:
    tmp = f"{path}.{os.getpid()}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, mode)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def install(launcher: str, runpath: str, src: str, site: str,
            python: str | None = None) -> int:
    """Write the run-path file, then the launcher that reads it; the number of modules."""
    python = python or os.path.join(os.path.dirname(launcher), "python3")
    data = build(python, src, site)
    _write(runpath, data, 0o644)
    _write(launcher, LAUNCHER.format(python=python, src=src, site=site,
                                     runpath=runpath).encode(), 0o755)
    return len(marshal.loads(data[4:])[1])


def main(argv: list[str]) -> int:
    if len(argv) != 4:
        sys.stderr.write(__doc__.split("\n\n")[1] + "\n")
        return 2
    n = install(*(os.path.abspath(a) for a in argv))
    sys.stdout.write(f"{argv[0]}: launcher written; {argv[1]}: {n} modules\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
