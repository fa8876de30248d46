"""The `corral` launcher and its run-path file: `corral run`'s modules compiled into one file.

    .venv/bin/python -m corral._runpath LAUNCHER RUNPATH SRC SITE   (scripts/setup.sh)

writes LAUNCHER (.venv/bin/corral) and RUNPATH (.venv/corral-runpath): the modules a fresh
`corral run` imports from source files (corral's own, and `__future__`, which their first
`from __future__ import annotations` loads in the usual import; found by importing the
run path in a fresh interpreter started as the launcher starts it), each compiled from
its source less what nothing on the run path reads (docstrings, functions' annotations:
`_stripped`; line numbers and asserts as the source has them) and with its future import
as a compiler flag (`_compiled`), then the table: each module's source path, size, mtime,
__cached__ and place in the file, and the path's extension module (corral.linux._csys)
by its file; all headed by this Python's bytecode magic number.

The launcher reads that file once and puts a finder first on sys.meta_path; a module it
holds is loaded from it when its file still has the size and mtime (ns) it had, else (or
for any module it does not hold) the usual import runs. It saves what importing a module
from its own .pyc costs beyond running the code: the directory stat and listing lookups,
a stat of the candidate file, the .pyc's open, fstat, read and checks (~30 us a module,
~1 ms of the 29 modules; docs/architecture.md); since session 11 also the unmarshalling
of the docstrings, a copy of the code's bytes (each module's code is unmarshalled in
place from the bytes read), the work of spec_from_file_location (the finder makes the
same spec directly, __cached__ worked out at build time) and the path finder's listings
of the directories for an extension module (_ctypes then; ~1 ms in all). The file is
used only when it is a regular file (opened without following a link or waiting on a
FIFO, then checked by its fd before any of it is read) of root or of this user that no one
else may write (as the .venv it lives in), with one link, under 64 MiB, read whole, and
made by this Python (magic number); anything odd: the usual import. A stale file is
harmless: each changed module falls back on its own, and `scripts/setup.sh` rewrites the
file.

Since session 12 the file also has a cold part, ahead of the modules' code: the build
traces a real `corral run` (`hot_functions`), and each function no traced run called is
a stub in its module's code (`_stub`, `_split`) whose code is unmarshalled from the file
on its first call: less code to unmarshal at every start (docs/architecture.md,
docs/benchmarks.md).
"""

from __future__ import annotations

import ast
import marshal
import os
import subprocess
import sys

#: what `corral run` imports at start (cli.py, then the sandbox, then the namespace tier);
#: every corral module that loads with them goes in the file
ENTRY_MODULES = ("corral.cli", "corral.runtime.sandbox", "corral.backends.namespace",
                 "corral.audit.record")

#: the launcher's finder, compiled into the file; run by the launcher with MODS, the
#: {module name: (source path, is a package, mtime ns, size, __cached__, (start, end,
#: stubs))} table, and DATA, the file's bytes, whose [start:end] is the module's
#: marshalled code (None for an extension module: the usual extension loader, given its
#: file), stubs whether that code has stubs of functions in the cold part (`_split`)
FINDER = '''
import marshal, posix, sys
_ext = sys.modules["_frozen_importlib_external"]
_Spec = sys.modules["_frozen_importlib"].ModuleSpec
# what importlib runs a module's code through: an error's traceback loses its frames as now
_call_with_frames_removed = sys.modules["_frozen_importlib"]._call_with_frames_removed


_Function = type(lambda: None)


def _cold_part(ns):
    """A module's __corral_cold__: the function a stub stands for (its code unmarshalled
    from the file's cold part on the stub's first call), made once, with the module's
    globals; the stub passes it every argument (the stub has the defaults)."""
    made = {}

    def cold(start, end):
        f = made.get(start)
        if f is None:
            f = made[start] = _Function(marshal.loads(DATA[start:end]), ns)
        return f
    return cold


class RunPathLoader(_ext.SourceFileLoader):
    """The source file's own loader, but its code comes from the run-path file (once)."""

    def __init__(self, name, path, code):
        self.name, self.path, self.code = name, path, code

    def get_code(self, fullname):
        code, self.code = self.code, None
        if code is None or fullname != self.name:
            return super().get_code(fullname)
        return marshal.loads(DATA[code[0]:code[1]])

    def exec_module(self, module):
        code = self.code
        if code is None or module.__name__ != self.name:
            return super().exec_module(module)   # its .py (get_code), as the usual import
        self.code = None   # as _LoaderBasics.exec_module with get_code, two calls fewer
        ns = module.__dict__
        if code[2]:   # its code has stubs (_split)
            ns["__corral_cold__"] = _cold_part(ns)
        _call_with_frames_removed(exec, marshal.loads(DATA[code[0]:code[1]]), ns)


class RunPathFinder:
    @staticmethod
    def find_spec(name, path=None, target=None):
        entry = MODS.get(name)
        if entry is None:
            return None
        file, is_pkg, mtime_ns, size, cached, code = entry
        try:
            st = posix.stat(file)
        except OSError:
            return None
        if st.st_mtime_ns != mtime_ns or st.st_size != size:
            return None   # edited since: the usual import (its .py, its .pyc)
        # as spec_from_file_location(name, file, loader=..., submodule_search_locations=
        # [its directory] or None) makes it, with its __cached__ worked out at build time
        if code is None:   # an extension module: its file, without the path's listings
            spec = _Spec(name, _ext.ExtensionFileLoader(name, file), origin=file)
            spec.has_location = True
            return spec
        spec = _Spec(name, RunPathLoader(name, file, code), origin=file)
        spec.has_location = True
        spec.cached = cached
        if is_pkg:
            spec.submodule_search_locations = [file.rpartition("/")[0]]
        return spec


sys.meta_path.insert(0, RunPathFinder)
'''

LAUNCHER = '''#!{python} -IS
import gc, sys
gc.disable()  # corral.cli.gc_back_on() turns it on again
sys.path += [{src!r}, {site!r}]  # after the standard library, as a .pth puts them
try:  # the run path's modules in one file, if ours and this Python's (corral/_runpath.py):
    import marshal, posix  # opened once, not through a link nor waiting (a FIFO), checked
    fd = posix.open({runpath!r}, posix.O_RDONLY | posix.O_NOFOLLOW | posix.O_NONBLOCK
                    | posix.O_CLOEXEC)   # by its fd, then read from it whole
    try:
        st = posix.fstat(fd)
        if (st.st_mode & 0o170000 == 0o100000 and st.st_uid in (0, posix.geteuid())
                and not st.st_mode & 0o022 and st.st_nlink == 1 and st.st_size < 1 << 26):
            data = posix.read(fd, st.st_size)
            if (len(data) == st.st_size
                    and data[:4] == sys.modules["_frozen_importlib_external"].MAGIC_NUMBER):
                view = memoryview(data)
                code, mods = marshal.loads(view[int.from_bytes(data[4:8], "little"):])
                exec(code, {{"MODS": mods, "DATA": view}})
    finally:
        posix.close(fd)
except (OSError, ValueError, EOFError, TypeError):
    pass
from corral.cli import entry
entry()
'''


def run_path_modules(python: str, paths: list[str]) -> list[tuple[str, str, bool, str | None]]:
    """(name, file, is a package, __cached__) of each module a fresh interpreter started
    like the launcher loads from a source file, or from an extension module's file
    (__cached__ None), with ENTRY_MODULES, in the order they loaded (frozen and built-in
    modules are not in it, nor what the interpreter loaded before: the encodings)."""
    code = (f"import sys; sys.path += {paths!r}; before = set(sys.modules)\n"
            f"import {', '.join(ENTRY_MODULES)}\n"
            "for n, m in [(n, m) for n, m in sys.modules.items() if n not in before]:\n"
            "    s = getattr(m, '__spec__', None)\n"
            "    kind = type(s.loader).__name__ if s else ''\n"
            "    if kind == 'SourceFileLoader' and s.origin.endswith('.py') or "
            "kind == 'ExtensionFileLoader':\n"
            "        print(n, s.origin, int(s.submodule_search_locations is not None), "
            "s.cached if kind == 'SourceFileLoader' else '', sep='\\t')")
    out = subprocess.run([python, "-IS", "-c", code], check=True, capture_output=True,
                         text=True, timeout=120).stdout
    return [(n, f, p == "1", c or None)
            for n, f, p, c in (ln.split("\t") for ln in out.splitlines())]


def _stripped(tree: ast.Module) -> ast.Module:
    """The module less what nothing on the run path reads and every start would unmarshal:
    the docstrings of the module, its classes and functions (each a first statement that
    is a string constant; a body left empty gets a `pass` on the same line), ~15% of the
    file, and the functions' annotations (their __annotations__; a class's, which a
    Record's fields are, stay). Everything else, asserts and line numbers too, stays as
    the source has it."""
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            node.returns = None
            a = node.args
            for arg in (*a.posonlyargs, *a.args, *a.kwonlyargs, a.vararg, a.kwarg):
                if arg is not None:
                    arg.annotation = None
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if (body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant)
                    and isinstance(body[0].value.value, str)):
                if len(body) == 1:
                    body[0] = ast.copy_location(ast.Pass(), body[0])
                else:
                    del body[0]
    return tree


def _compiled(source: bytes, file: str):
    """The module's code from its stripped tree (`_stripped`), its `from __future__ import`
    turned into the compiler flags it stands for: the code is the same (annotations stay
    strings), but running it imports nothing (the `__future__` module, and its name in
    each module's namespace, ~0.1 ms of a start over 28 modules)."""
    import __future__

    tree, flags = _stripped(ast.parse(source, file)), 0
    for node in [n for n in tree.body if isinstance(n, ast.ImportFrom)
                 and n.module == "__future__"]:
        for alias in node.names:
            flags |= getattr(__future__, alias.name).compiler_flag
        tree.body.remove(node)
    return compile(tree, file, "exec", flags=flags, dont_inherit=True)


#: a function's code goes to the cold part only when its marshalled bytes are at least
#: this many (a stub is ~150 to 250 bytes: below this the stub costs about what it saves)
COLD_MIN_BYTES = 400

#: code flags that keep a function's code in place: a stub is a plain function, so a
#: generator's or coroutine's would change what inspect and asyncio see of it
_KEEP_FLAGS = 0x20 | 0x80 | 0x100 | 0x200   # GENERATOR, COROUTINE, ITERABLE_COROUTINE, ASYNC_GENERATOR

#: what the trace runs (the usual `corral run`, and its --json face), each after an
#: untraced first run that fills the trace's state directory's caches
TRACED_RUNS = (("run", "--", "/bin/true"), ("run", "--json", "--", "/bin/true"))

#: the trace's hook: every Python function called (setprofile's "call": the main thread,
#: and threads started by threading), noted as (file, first line, qualified name) at exit
#: (registered first, so it runs after every other exit handler)
_TRACE = """import sys, atexit
_hot = set()
def _note(frame, event, arg):
    if event == "call":
        c = frame.f_code
        _hot.add((c.co_filename, c.co_firstlineno, c.co_qualname))
atexit.register(lambda: open({out!r}, "w").write(repr(sorted(_hot))))
sys.setprofile(_note)
import threading
threading.setprofile(_note)
"""


def hot_functions(python: str, src: str, site: str) -> set | None:
    """(file, first line, qualified name) of each function a real `corral run -- /bin/true`
    (and `run --json`) calls, traced in a fresh interpreter started as the launcher
    starts it, without the run-path file (its modules from their sources), with a state
    directory of its own (its audit records go there, not to the user's); None when a
    run fails (no sandbox here: then nothing goes to the cold part)."""
    import ast
    import tempfile

    body = LAUNCHER.format(python=python, src=src, site=site,
                           runpath="/nonexistent/corral-runpath").split("\n", 1)[1]
    hot: set = set()
    with tempfile.TemporaryDirectory(prefix="corral-runpath-trace-") as tmp:
        env = {**os.environ, "CORRAL_STATE_DIR": os.path.join(tmp, "state")}
        out = os.path.join(tmp, "hot")
        try:
            for argv in TRACED_RUNS:
                for hook in ("", _TRACE.format(out=out)):
                    r = subprocess.run([python, "-IS", "-c", hook + body, *argv], env=env,
                                       stdin=subprocess.DEVNULL, capture_output=True,
                                       timeout=120)
                    if r.returncode != 0:
                        return None
                with open(out) as f:
                    hot.update(ast.literal_eval(f.read()))
                os.unlink(out)
        except (OSError, subprocess.SubprocessError, ValueError, SyntaxError):
            return None
    return hot


def _stub(real, start: int, end: int):
    """A function code standing for `real`: the same name, qualified name, file, first
    line and parameters (so the function made from it at import takes the same defaults
    and binds its arguments as the real one would), whose body is one call of the real
    function, made on first use from the file's [start:end] (`__corral_cold__` in the
    finder), with every argument."""
    n = real.co_argcount + real.co_kwonlyargcount
    names = real.co_varnames
    pos, kwonly = list(names[:real.co_argcount]), list(names[real.co_argcount:n])
    star = names[n] if real.co_flags & 0x04 else None              # VARARGS
    dstar = names[n + bool(star)] if real.co_flags & 0x08 else None  # VARKEYWORDS
    params = list(pos)
    if real.co_posonlyargcount:
        params.insert(real.co_posonlyargcount, "/")
    if star or kwonly:
        params.append(f"*{star or ''}")
    params += kwonly
    args = pos + ([f"*{star}"] if star else []) + [f"{k}={k}" for k in kwonly]
    if dstar:
        params.append(f"**{dstar}")
        args.append(f"**{dstar}")
    text = (f"def f({', '.join(params)}): "
            f"return __corral_cold__({start}, {end})({', '.join(args)})\n")
    code = compile(text, real.co_filename, "exec", dont_inherit=True).co_consts[0]
    return code.replace(co_name=real.co_name, co_qualname=real.co_qualname,
                        co_firstlineno=real.co_firstlineno)


def _split(code, hot: set, cold: list[bytes], at: int) -> tuple:
    """`code` with each function code nested in it that the trace did not see called
    (`hot`), and that a stub can stand for, replaced by a stub (`_stub`), its own code's
    bytes appended to `cold` from offset `at` of the file: (the new code, the next
    offset). Kept in place: what was called (its nested functions may still go), what
    has free variables (a closure's cells, `super()`'s __class__: a stub cannot pass
    them), generators and coroutines, lambdas and comprehensions, class bodies (run at
    import), and what is smaller than COLD_MIN_BYTES."""
    consts = list(code.co_consts)
    for i, c in enumerate(consts):
        if not hasattr(c, "co_code"):
            continue
        if (c.co_flags & 0x3 == 0x3   # OPTIMIZED, NEWLOCALS: a function's (a class body's not)
                and (c.co_filename, c.co_firstlineno, c.co_qualname) not in hot
                and not c.co_freevars and not c.co_flags & _KEEP_FLAGS
                and not c.co_name.startswith("<")):
            data = marshal.dumps(c)
            if len(data) >= COLD_MIN_BYTES:
                cold.append(data)
                consts[i], at = _stub(c, at, at + len(data)), at + len(data)
                continue
        consts[i], at = _split(c, hot, cold, at)
    return code.replace(co_consts=tuple(consts)), at


def build(python: str, src: str, site: str, hot: set | None | bool = True) -> bytes:
    """The run-path file's bytes: the magic number; the offset (4 bytes, little-endian) of
    the table; the cold part (the marshalled code of each function a default run does not
    call, `_split`; none when `hot` is None: `hot_functions`, traced unless given);
    each source module's marshalled code; the table, marshal((finder code, MODS)), MODS
    being {name: (file, is a package, mtime ns, size, __cached__, (start, end, whether its
    code has stubs) of its code in the file)}, with __cached__ and that None for an
    extension module (the finder gives its file to the usual extension loader)."""
    from importlib.util import MAGIC_NUMBER

    if hot is True:
        hot = hot_functions(python, src, site)
    mods, compiled, cold, at = {}, [], [], 8
    for name, file, is_pkg, cached in run_path_modules(python, [src, site]):
        with open(file, "rb") as f:
            st = os.fstat(f.fileno())
            source = f.read() if cached is not None else b""
        code, split = None, False
        if cached is not None:
            code = _compiled(source, file)
            if hot is not None:
                before = at
                code, at = _split(code, hot, cold, at)
                split = at > before
        compiled.append((name, file, is_pkg, st, cached, code, split))
    codes = []
    for name, file, is_pkg, st, cached, code, split in compiled:
        where = None
        if code is not None:
            data = marshal.dumps(code)
            codes.append(data)
            where, at = (at, at + len(data), split), at + len(data)
        mods[name] = (file, is_pkg, st.st_mtime_ns, st.st_size, cached, where)
    finder = compile(FINDER, "<corral-runpath>", "exec", dont_inherit=True)
    return b"".join([MAGIC_NUMBER, at.to_bytes(4, "little"), *cold, *codes,
                     marshal.dumps((finder, mods))])


def table(data: bytes) -> tuple:
    """A run-path file's (finder code, MODS), as the launcher reads them."""
    return marshal.loads(data[int.from_bytes(data[4:8], "little"):])


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
    return len(table(data)[1])


def main(argv: list[str]) -> int:
    if len(argv) != 4:
        sys.stderr.write(__doc__.split("\n\n")[1] + "\n")
        return 2
    n = install(*(os.path.abspath(a) for a in argv))
    sys.stdout.write(f"{argv[0]}: launcher written; {argv[1]}: {n} modules\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
