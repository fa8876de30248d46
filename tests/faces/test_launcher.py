"""The `corral` launcher and its run-path file (corral/_runpath.py): the run path's modules
come from the file while their sources are unchanged, and from the usual import when a
source changed or the file is not to be trusted. Real interpreters, a real `corral run`."""

import importlib.util
import json
import marshal
import os
import subprocess
import sys

import pytest
from conftest import CORRAL, ROOT

from corral import _runpath

SRC = os.path.join(ROOT, "src")
PYTHON = os.path.join(ROOT, ".venv", "bin", "python3")
SITE = next(p for p in sys.path if p.endswith("site-packages") and ROOT in p)
#: what the launcher's process says about itself at exit: each module's loader
REPORT = ("import atexit, json, sys\n"
          "atexit.register(lambda: open({out!r}, 'w').write(json.dumps({{n: "
          "type(m.__spec__.loader).__name__ for n, m in sys.modules.items() "
          "if getattr(m, '__spec__', None)}})))\n")


def run_launcher(tmp_path, text: str, *args) -> tuple[subprocess.CompletedProcess, dict]:
    """Run a launcher's text as the launcher runs (its #! interpreter and flags), with a
    hook that notes each corral module's loader."""
    out = tmp_path / "loaders.json"
    python = text.splitlines()[0][2:].split()
    r = subprocess.run([*python, "-c", REPORT.format(out=str(out)) + text, *args],
                       capture_output=True, text=True, timeout=60)
    return r, json.loads(out.read_text())


def launcher_for(tmp_path, data: bytes, mode: int = 0o644) -> str:
    path = tmp_path / "runpath"
    path.write_bytes(data)
    os.chmod(path, mode)
    return _runpath.LAUNCHER.format(python=PYTHON, src=SRC, site=SITE, runpath=str(path))


def test_the_installed_launcher_loads_the_run_path_from_its_file(tmp_path):
    """The installed launcher reads the installed file: every module whose source is as
    it was when scripts/setup.sh wrote the file comes from it (a module edited since comes
    the usual way until setup.sh runs again)."""
    with open(CORRAL) as f:
        text = f.read()
    runpath = os.path.join(ROOT, ".venv", "corral-runpath")
    assert repr(runpath) in text
    with open(runpath, "rb") as f:
        _, mods = _runpath.table(f.read())
    r, loaders = run_launcher(tmp_path, text, "run", "--json", "--", "/bin/echo", "hi")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["stdout"] == "hi\n"
    assert "corral.cli" in mods and "corral.backends.namespace" in mods
    for name, (file, _, mtime_ns, size, _, where) in mods.items():
        if name == "__future__":   # in the table, but the file's code does not import it
            assert name not in loaders
            continue
        if where is None:   # an extension module: its usual loader either way
            assert loaders[name] == "ExtensionFileLoader"
            continue
        if not os.path.exists(file):   # a module moved away since: not imported at all
            assert name not in loaders
            continue
        st = os.stat(file)
        same = (st.st_mtime_ns, st.st_size) == (mtime_ns, size)
        assert loaders[name] == ("RunPathLoader" if same else "SourceFileLoader"), name


def test_a_fresh_file_holds_every_module_of_the_run_path(tmp_path):
    r, loaders = run_launcher(tmp_path, launcher_for(tmp_path, _runpath.build(PYTHON, SRC,
                                                                              SITE)),
                              "run", "--", "/bin/true")
    assert r.returncode == 0, r.stderr
    from_file = sorted(n for n, kind in loaders.items() if kind == "RunPathLoader")
    ours = sorted(n for n in loaders if n.startswith("corral") and n != "corral.linux._csys")
    assert from_file == ours, set(ours) - set(from_file)
    assert loaders["corral.linux._csys"] == "ExtensionFileLoader"   # corral's C module
    # the file's code has its `from __future__ import annotations` as a compiler flag
    assert "__future__" not in loaders


def test_a_changed_source_is_imported_as_usual(tmp_path):
    data = _runpath.build(PYTHON, SRC, SITE)
    finder, mods = _runpath.table(data)
    file, is_pkg, mtime_ns, size, cached, code = mods["corral.linux.limits"]
    mods["corral.linux.limits"] = (file, is_pkg, mtime_ns - 1, size, cached, code)   # "edited"
    at = int.from_bytes(data[4:8], "little")
    text = launcher_for(tmp_path, data[:at] + marshal.dumps((finder, mods)))
    r, loaders = run_launcher(tmp_path, text, "run", "--", "/bin/true")
    assert r.returncode == 0, r.stderr
    assert loaders["corral.linux.limits"] == "SourceFileLoader"
    assert loaders["corral.cli"] == "RunPathLoader"


@pytest.mark.parametrize("why", ["another Python's magic number", "group-writable",
                                 "not marshal data"])
def test_a_file_not_to_be_trusted_is_not_used(tmp_path, why):
    data = _runpath.build(PYTHON, SRC, SITE)
    mode = 0o644
    if why == "group-writable":
        mode = 0o664
    elif why == "another Python's magic number":
        data = b"\x00\x00\r\n" + data[4:]
    else:
        data = data[:4] + b"\xff not marshal"
    r, loaders = run_launcher(tmp_path, launcher_for(tmp_path, data, mode), "run", "--",
                              "/bin/true")
    assert r.returncode == 0, r.stderr
    assert "RunPathLoader" not in loaders.values(), why


def test_without_the_file_the_launcher_runs_as_usual(tmp_path):
    text = _runpath.LAUNCHER.format(python=PYTHON, src=SRC, site=SITE,
                                    runpath=str(tmp_path / "missing"))
    r, loaders = run_launcher(tmp_path, text, "--version")
    assert r.returncode == 0 and r.stdout.startswith("corral ")
    assert "RunPathLoader" not in loaders.values() and loaders["corral.cli"] == "SourceFileLoader"


def test_the_file_holds_what_a_fresh_run_imports():
    """The table lists the modules a fresh interpreter loads from source files with the run
    path's entry modules, each with its own source's path, size and code."""
    names = [n for n, _, _, _ in _runpath.run_path_modules(PYTHON, [SRC, SITE])]
    data = _runpath.build(PYTHON, SRC, SITE)
    _, mods = _runpath.table(data)
    assert sorted(mods) == sorted(names) and "corral.runtime.sandbox" in mods
    # the standard library's one source module on the path (the others are frozen), and
    # the one extension module, corral's own (its file: the finder spares the listings)
    assert [n for n in mods if not n.startswith("corral")] == ["__future__"]
    assert [n for n, entry in mods.items() if entry[4] is None] == ["corral.linux._csys"]
    file, is_pkg, _, size, cached, (start, end, _) = mods["corral.linux"]
    assert is_pkg and file == os.path.join(SRC, "corral", "linux", "__init__.py")
    assert size == os.path.getsize(file)
    assert marshal.loads(data[start:end]).co_filename == file
    assert cached == importlib.util.cache_from_source(file)


@pytest.mark.parametrize("what", ["a FIFO", "a link to a good file", "a directory"])
def test_only_a_regular_file_is_opened_and_used(tmp_path, what):
    """The file is opened without following a link and without waiting (a FIFO with no
    writer), and checked by its fd before anything is read: what is not a regular file of
    ours, or is reached through a link, is not used, and the launcher never hangs on it."""
    path = tmp_path / "runpath"
    if what == "a FIFO":
        os.mkfifo(path, 0o644)
    elif what == "a directory":
        path.mkdir(0o755)
    else:
        good = tmp_path / "good"
        good.write_bytes(_runpath.build(PYTHON, SRC, SITE))
        os.chmod(good, 0o644)
        os.symlink(good, path)
    text = _runpath.LAUNCHER.format(python=PYTHON, src=SRC, site=SITE, runpath=str(path))
    r, loaders = run_launcher(tmp_path, text, "run", "--", "/bin/true")
    assert r.returncode == 0, r.stderr
    assert "RunPathLoader" not in loaders.values(), what
    assert loaders["corral.cli"] == "SourceFileLoader"


def _codes(code):
    yield code
    for c in code.co_consts:
        if hasattr(c, "co_code"):
            yield from _codes(c)


def test_the_file_keeps_line_numbers_and_asserts_but_no_docstrings(tmp_path):
    """The file's code is its source's, less the docstrings and the functions' annotations
    (a class's stay: a Record's fields), its `from __future__ import annotations` a
    compiler flag (annotations stay strings; nothing imported): each function starts and
    runs on the lines the source gives it (tracebacks name the right lines), an assert
    still fails, and a body that was only a docstring still compiles."""
    src = tmp_path / "m.py"
    src.write_text('"""module doc"""\n\n\ndef f(x: int) -> int:\n    """f\'s doc\n    two lines"""\n'
                   '    assert x, "no x"\n    return x\n\n\nclass C:\n    """only a doc"""\n'
                   '\n\nclass R:\n    """a record"""\n    y: int = 1\n')
    later = tmp_path / "later.py"   # as the run path's modules start
    later.write_text('"""doc"""\n\nfrom __future__ import annotations\n\n\n'
                     'class R:\n    y: Undefined = 1\n')
    ns = {"__name__": "later"}
    exec(_runpath._compiled(later.read_bytes(), str(later)), ns)
    assert ns["R"].__annotations__ == {"y": "Undefined"} and "annotations" not in ns
    code = _runpath._compiled(src.read_bytes(), str(src))
    ns = {"__name__": "m"}
    exec(code, ns)
    assert ns.get("__doc__") is None and ns["f"].__doc__ is None and ns["C"].__doc__ is None
    assert ns["f"].__annotations__ == {} and ns["R"].__annotations__ == {"y": int}
    with pytest.raises(AssertionError, match="no x") as e:
        ns["f"](0)
    assert e.traceback[-1].lineno + 1 == 7   # the assert's line (pytest counts from 0)
    data = _runpath.build(PYTHON, SRC, SITE, hot=None)   # no cold part: every code in place
    _, mods = _runpath.table(data)
    file, _, _, _, _, (start, end, stubs) = mods["corral.runtime.sandbox"]
    assert not stubs
    with open(file) as f:
        plain = compile(f.read(), file, "exec", dont_inherit=True)
    ours = {c.co_qualname: c for c in _codes(marshal.loads(data[start:end]))}
    for c in _codes(plain):
        lines = {n for _, _, n in c.co_lines() if n is not None}
        assert ours[c.co_qualname].co_firstlineno == c.co_firstlineno, c.co_qualname
        assert {n for _, _, n in ours[c.co_qualname].co_lines() if n} <= lines, c.co_qualname


def test_the_finder_gives_each_module_its_file_and_its_usual_spec():
    """What the launcher's finder answers for a module it holds is what the usual import
    would (origin, __file__, __cached__, package path; an extension module through the
    usual extension loader), and nothing for one edited since."""
    data = _runpath.build(PYTHON, SRC, SITE)
    finder, mods = _runpath.table(data)
    ns = {"MODS": mods, "DATA": memoryview(data)}
    exec(finder, ns)
    sys.meta_path.remove(ns["RunPathFinder"])   # this process keeps its usual import
    find = ns["RunPathFinder"].find_spec
    for name in ("corral.linux", "corral.cli", "corral.linux._csys"):
        ours, usual = find(name), importlib.util.find_spec(name)
        assert (ours.origin, ours.cached, ours.has_location, ours.parent) == \
            (usual.origin, usual.cached, usual.has_location, usual.parent), name
        assert ours.submodule_search_locations == usual.submodule_search_locations, name
    ext = "corral.linux._csys"
    assert type(find(ext).loader) is type(importlib.util.find_spec(ext).loader)
    assert type(find("corral.cli").loader).__name__ == "RunPathLoader"
    file, is_pkg, mtime_ns, size, cached, where = mods[ext]
    mods[ext] = (file, is_pkg, mtime_ns + 1, size, cached, where)
    assert find(ext) is None and find("json") is None


# -- the cold part: functions a default run does not call, loaded on their first call ------

COLD_SOURCE = '''
import os


def plain(a, b=2, *rest, c, d=4, **kw):
    out = [a, b, rest, c, d, sorted(kw.items())]
    for i in range(3):
        out.append(i * a)
    return out


def positional(x, y=10, /, z=20):
    return x, y, z, sum(range(x)) + len(os.sep)


class Thing:
    def __init__(self, n):
        self.n = n

    def method(self, k=1, *, scale=3):
        total = 0
        for i in range(self.n):
            total += i * k * scale
        return total, type(self).__name__

    @staticmethod
    def static(v):
        return [v] * 3 + [v, v, v, v, v, v, v, v]

    def fails(self):
        raise ValueError(f"thing {self.n} failed at its own line")

    def gen(self):
        yield from range(self.n)

    def closure(self):
        n = self.n

        def inner(q=1):
            return n * q + len([1, 2, 3, 4, 5, 6, 7, 8])
        return inner
'''


def test_a_cold_function_is_a_stub_that_calls_its_own_code(tmp_path, monkeypatch):
    """Every function `_split` moves to the cold part (here: all it may) is a stub with
    the real one's name, file, first line and parameters: called with every way of
    passing arguments, defaults included, it gives what the function itself gives, its
    code made once from the file's cold part on first use; a failure's traceback ends in
    the real function at its own line. Generators and closures stay in place."""
    src = tmp_path / "m.py"
    src.write_text(COLD_SOURCE)
    monkeypatch.setattr(_runpath, "COLD_MIN_BYTES", 0)
    plain_code = _runpath._compiled(src.read_bytes(), str(src))
    cold: list[bytes] = []
    split, at = _runpath._split(plain_code, set(), cold, 0)
    moved = {marshal.loads(c).co_qualname for c in cold}
    assert moved == {"plain", "positional", "Thing.__init__", "Thing.method", "Thing.static",
                     "Thing.fails", "Thing.closure"}, moved   # not inner: a closure
    finder = {"DATA": memoryview(b"".join(cold))}
    exec(compile(_runpath.FINDER, "<corral-runpath>", "exec"), finder)
    sys.meta_path.remove(finder["RunPathFinder"])
    ours = {"__name__": "m"}
    ours["__corral_cold__"] = finder["_cold_part"](ours)
    exec(split, ours)
    usual = {"__name__": "m"}
    exec(plain_code, usual)
    assert ours["plain"].__code__.co_qualname == "plain"
    assert ours["plain"].__code__.co_firstlineno == usual["plain"].__code__.co_firstlineno
    assert ours["plain"].__defaults__ == usual["plain"].__defaults__
    assert ours["plain"].__kwdefaults__ == usual["plain"].__kwdefaults__
    assert len(ours["plain"].__code__.co_code) < len(usual["plain"].__code__.co_code)
    for name, args, kwargs in [
            ("plain", (1,), {"c": 3}), ("plain", (1, 5, 6, 7), {"c": 3, "d": 0, "e": 9}),
            ("positional", (3,), {}), ("positional", (3, 4), {"z": 5})]:
        assert ours[name](*args, **kwargs) == usual[name](*args, **kwargs), name
    for ns in (ours, usual):
        with pytest.raises(TypeError):
            ns["positional"](1, y=2)   # positional-only stays positional-only
        with pytest.raises(TypeError):
            ns["plain"](1)             # a keyword-only argument without a default
    a, b = ours["Thing"](4), usual["Thing"](4)
    assert a.method() == b.method() and a.method(2, scale=5) == b.method(2, scale=5)
    assert ours["Thing"].static(7) == usual["Thing"].static(7)
    assert list(a.gen()) == list(b.gen()) == [0, 1, 2, 3]
    assert a.closure()(3) == b.closure()(3)
    made = next(c.cell_contents for c in ours["__corral_cold__"].__closure__
                if c.cell_contents is not ours)
    assert len(made) == 6   # each called function's code made once
    a.method()
    assert len(made) == 6
    with pytest.raises(ValueError, match="thing 4 failed") as e:
        a.fails()
    line = next(i for i, t in enumerate(COLD_SOURCE.splitlines(), 1) if "raise ValueError" in t)
    assert (e.traceback[-1].lineno + 1, e.traceback[-1].name) == (line, "fails")


CASES = [   # (name, the run's arguments before --, the command): each needs the cold part
    ("a rw workspace", lambda ws: ["--workspace", f"{ws}:rw"],
     ["/bin/sh", "-c", "echo new > /workspace/made; cat /workspace/seed"]),
    ("a review workspace, discarded", lambda ws: ["--workspace", f"{ws}:review", "--discard"],
     ["/bin/sh", "-c", "echo x > /workspace/review-made"]),
    ("env and limits", lambda ws: ["--env", "A=1", "--memory", "128M", "--pids", "20"],
     ["/bin/sh", "-c", "echo $A"]),
    ("a timeout", lambda ws: ["--timeout", "0.3"], ["/bin/sleep", "5"]),
    ("a missing command", lambda ws: [], ["/no/such/command"]),
    ("a policy error", lambda ws: ["--memory", "lots"], ["/bin/true"]),
    ("a usage error", lambda ws: ["--workspace", f"{ws}:rx"], ["/bin/true"]),
    ("a tier that cannot", lambda ws: ["--isolation", "nosuchtier"], ["/bin/true"]),
    ("a policy file", lambda ws: ["--policy", str(ws / ".." / "policy.toml")],
     ["/bin/sh", "-c", "echo $FROM_FILE"]),
]


def _comparable(stdout: str) -> dict:
    d = json.loads(stdout)
    d.pop("usage", None)   # timings
    return d


#: at exit, on stderr: how many functions of the cold part were made (each module's
#: __corral_cold__ keeps them in its closure)
COUNT_COLD = ("import atexit, posix, sys\n"
              "def _cold():\n"
              "    n = 0\n"
              "    for m in list(sys.modules.values()):\n"
              "        f = getattr(m, '__corral_cold__', None)\n"
              "        if f is not None:\n"
              "            n += sum(len(c.cell_contents) for c in f.__closure__\n"
              "                     if c.cell_contents is not m.__dict__)\n"
              "    posix.write(2, f'@cold {n}@'.encode())\n"
              "atexit.register(_cold)\n")


def run_both(tmp_path, argv, env, files_in=None) -> list[tuple]:
    """`corral ARGV` through the installed launcher (its file and its cold part), then
    through the same launcher without its file: (exit status, stdout, stderr, how many
    cold functions were made, the files in `files_in(i)` after) of each."""
    with open(CORRAL) as f:
        text = f.read()
    without = text.replace(os.path.join(ROOT, ".venv", "corral-runpath"),
                           str(tmp_path / "missing"))
    seen = []
    for i, launcher in enumerate((text, without)):
        python = launcher.splitlines()[0][2:].split()
        r = subprocess.run([*python, "-c", COUNT_COLD + launcher, *argv(i)],
                           capture_output=True, text=True, timeout=60,
                           stdin=subprocess.DEVNULL, env=env)
        err, _, rest = r.stderr.rpartition("@cold ")
        files = sorted(p.name for p in files_in(i).iterdir()) if files_in else None
        seen.append((r.returncode, r.stdout, err, int(rest.split("@")[0]), files))
    return seen


@pytest.mark.parametrize("name,flags,command", CASES, ids=[c[0] for c in CASES])
def test_a_run_that_needs_the_cold_part_ends_as_with_the_usual_import(tmp_path, name, flags,
                                                                       command):
    """`corral run --json` through the installed launcher, whose file holds the cold part,
    with a policy or an ending a default run does not have (the functions it calls are
    stubs there): the same exit status, Result JSON (less its timings), messages and
    files as the same launcher without its file (every module from its source); and the
    cold part was used."""
    (tmp_path / "policy.toml").write_text('[env]\nset = { FROM_FILE = "yes" }\n')
    for i in (0, 1):
        (tmp_path / f"ws{i}").mkdir()
        (tmp_path / f"ws{i}" / "seed").write_text("seed\n")
    (code, out, err, cold, files), (code0, out0, err0, cold0, files0) = run_both(
        tmp_path, lambda i: ["run", "--json", *flags(tmp_path / f"ws{i}"), "--", *command],
        {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}, lambda i: tmp_path / f"ws{i}")
    assert (code, _comparable(out), err.replace("ws0", "ws1"), files) == \
        (code0, _comparable(out0), err0, files0), name
    assert cold > 0 and cold0 == 0, (name, cold, cold0)


@pytest.mark.skipif(os.geteuid() != 0, reason="network allow needs root")
def test_a_run_with_network_allow_and_a_secret_ends_as_with_the_usual_import(tmp_path, world):
    """The egress proxy and a secret's injection through the cold part: the same answer,
    the same header injected, the same Result as without the launcher's file."""
    from netfix import GRANT_PRIV, TOKEN

    argv = ["run", "--json", "--allow-domain", "granted.test", "--allow-private", GRANT_PRIV,
            "--nameserver", f"127.0.0.1:{world['dns']}", "--secret",
            "GH=env:GH_TOKEN@granted.test", "--plain-http", "GH", "--", "/bin/sh", "-c",
            'curl -sS -m 20 -o /dev/null -w "%{http_code}" -H "X-T: $GH" '
            "http://granted.test/echo"]
    before = len(world["log"])
    (code, out, err, cold, _), (code0, out0, err0, cold0, _) = run_both(
        tmp_path, lambda i: argv, {"PATH": "/usr/bin:/bin", "GH_TOKEN": TOKEN})
    seen = [h for rec in world["log"][before:] for k, h in rec["headers"] if k.lower() == "x-t"]
    assert seen == [TOKEN, TOKEN]
    assert (code, _comparable(out)["stdout"], err) == (code0, _comparable(out0)["stdout"], err0)
    assert code == 0 and _comparable(out)["stdout"] == "200", (out, err)
    assert cold > 0 and cold0 == 0


def test_without_a_run_to_trace_nothing_goes_to_the_cold_part(tmp_path):
    """When the traced run cannot run (here: no corral on its path), the file is built with
    every function in place (no stubs, no cold part): slower, never wrong."""
    assert _runpath.hot_functions(PYTHON, str(tmp_path), str(tmp_path)) is None
    data = _runpath.build(PYTHON, SRC, SITE, hot=None)
    _, mods = _runpath.table(data)
    assert not any(where[2] for where in (m[5] for m in mods.values()) if where)
    assert min(where[0] for where in (m[5] for m in mods.values()) if where) == 8
    hot = _runpath.hot_functions(PYTHON, SRC, SITE)
    assert ("corral.cli", "cmd_run") in {(f.rpartition("/src/")[2][:-3].replace("/", "."), q)
                                         for f, _, q in hot}
    _, mods = _runpath.table(_runpath.build(PYTHON, SRC, SITE, hot=hot))
    assert mods["corral.cli"][5][2] and not mods["corral.linux"][5][2]
