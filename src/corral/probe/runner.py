"""Runs the catalogue against tiers and scores each case from what is seen outside.

One case on one tier:
1. expected: every property or rule the case cites holds in `explain` for the case's
   policy on that tier (explain reads the same plan `corral run` runs);
2. safety gate: a case that would harm the host if uncontained (SAFETY) runs only when the
   tier enforces what it relies on; otherwise it scores "not contained" without running;
3. positive control: the same attack without the sandbox (on the host, in a throw-away
   process) or with the rule off; it must succeed, else the case is "invalid" (or
   "unsupported" when the host lacks the feature), never "contained";
4. the attack, through the real `corral run --json` (a separate supervisor process, so
   that a supervisor killed or crashed by the case is seen, not suffered);
5. scoring: canary token in any output, event or sink (READ); a host file of the probe
   changed (WRITE); the escape marker created or a process outliving the run (ESCAPE);
   the supervisor dead or without a Result (CRASH); then the case's own scorer, or the
   PROBE ALLOWED / DENIED line the code printed for attacks that cannot be observed from
   outside without doing harm (a syscall that got past its permission check).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field

from . import prelude
from .canaries import Canaries
from .cases import Case

PY = "/usr/bin/python3"

BASE_POLICY = {"limits": {"timeout": "15s"}}
#: starts argv[1:] as from `nohup` in a shell that trapped SIGINT, with SIGUSR1 and SIGUSR2
#: blocked (a caller's state that exec keeps): for cases with NOHUP = True
NOHUP_WRAPPER = ("import os, signal, sys\n"
                 "for s in (signal.SIGINT, signal.SIGHUP):\n"
                 "    signal.signal(s, signal.SIG_IGN)\n"
                 "signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR1, signal.SIGUSR2})\n"
                 "os.execvp(sys.argv[1], sys.argv[1:])\n")
#: a positive control shows that the attack works with the rule off; a slow or busy
#: machine must not stop it first, so its wall clock and CPU time are at least this
#: (seconds), and a host control may take this long. A control that succeeds takes only
#: the time it needs; only a broken one waits this long.
CONTROL_LIMIT_S = 120.0

# statuses; FAILING: an expected (claimed) case in one of these breaks the claim
CONTAINED, NOT_CONTAINED, NOT_RUN = "contained", "not-contained", "not-run"
INVALID, UNSUPPORTED, REFUSED, INCONCLUSIVE = "invalid", "unsupported", "refused", "inconclusive"
FAILING = (NOT_CONTAINED, NOT_RUN, INVALID, INCONCLUSIVE)


@dataclass
class Obs:
    """What one run left behind, seen from outside."""
    where: str                      # "sandbox" or "host"
    tier: str
    policy: dict
    rc: int | None = None
    result: dict | None = None      # the Result (sandbox runs)
    error: dict | None = None       # corral's error object (refused, setup failure)
    stdout: str = ""
    stderr: str = ""
    supervisor_stderr: str = ""
    sink: bytes = b""
    dns: str = ""
    changed: list = field(default_factory=list)
    escaped: bool = False
    leftover: list = field(default_factory=list)
    crashed: str | None = None
    wall: float = 0.0
    earlier: str = ""               # the first run's output (cases with SECOND)

    def tags(self) -> list[tuple[str, str]]:
        out = []
        for line in self.stdout.splitlines():
            if line.startswith("PROBE "):
                _, _, rest = line.partition(" ")
                tag, _, detail = rest.partition(" ")
                out.append((tag, detail))
        return out

    def tag(self, name: str) -> str | None:
        return next((d for t, d in self.tags() if t == name), None)

    @property
    def verdict(self) -> str | None:
        return self.result.get("verdict") if self.result else None

    @property
    def events(self) -> list:
        return self.result.get("events", []) if self.result else []

    def limit(self, section: str, key: str):
        return self.policy.get(section, {}).get(key)


@dataclass
class Cell:
    case: Case
    tier: str
    expected: bool
    status: str
    contained: bool | None
    reason: str
    seconds: float = 0.0

    @property
    def failing(self) -> bool:
        """A claim that did not hold, or a case that could not be scored (a broken case
        or control is a failure whether or not the tier claims anything)."""
        return self.status in (INVALID, INCONCLUSIVE) or (self.expected and self.status in FAILING)

    def to_dict(self) -> dict:
        return {"id": self.case.id, "category": self.case.category, "tier": self.tier,
                "expected": self.expected, "contained": self.contained,
                "reason": self.reason, "status": self.status,
                "seconds": round(self.seconds, 2)}


def deep_merge(base: dict, over: dict) -> dict:
    out = dict(base)
    for k, v in over.items():
        out[k] = deep_merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def fill(obj, consts: dict):
    """Format the strings of a POLICY with the probe's constants ({SINK_HOST}, ...)."""
    if isinstance(obj, str):
        return obj.format(**consts)
    if isinstance(obj, dict):
        return {k: fill(v, consts) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [fill(v, consts) for v in obj]
    return obj


class Runner:
    def __init__(self, canaries: Canaries, *, log=None, image: str | None = None) -> None:
        self.cn = canaries
        #: the image the microvm tier boots (it refuses the host's root)
        self.image = image
        self.consts = canaries.constants()
        self._explain_cache: dict = {}
        self._host_controls: dict = {}
        self.log = log or (lambda msg: None)

    # --- the plan side: what the tier claims --------------------------------------

    def policy_for(self, case: Case, tier: str, over: dict | None = None) -> dict:
        d = deep_merge(BASE_POLICY, fill(case.policy, self.consts))
        if over:
            d = deep_merge(d, fill(over, self.consts))
        env = dict(d.get("env", {}))
        env["set"] = {**env.get("set", {}), "PROBE_DATA": self.cn.data}
        d["env"] = env
        d["isolation"] = tier
        if tier == "microvm" and self.image and "image" not in d:
            d["image"] = self.image
        return d

    def explain(self, policy: dict) -> dict:
        key = json.dumps(policy, sort_keys=True)
        if key not in self._explain_cache:
            from ..errors import CorralError
            from ..policy import policy_from_dict
            from ..runtime.explain import explain

            try:
                self._explain_cache[key] = explain(policy_from_dict(policy))
            except CorralError as e:
                self._explain_cache[key] = {"runs": False, "refused": e.to_dict(),
                                            "properties": {}, "rules": []}
        return self._explain_cache[key]

    @staticmethod
    def holds(claims, ex: dict) -> list[str]:
        """The claims that do NOT hold in this explain output."""
        rules = {r["rule"]: r["enforced_by"] for r in ex.get("rules", [])}
        props = ex.get("properties", {})
        missing = []
        for claim in claims:
            ok = False
            for alt in claim.split("|"):
                if alt.startswith("rule:"):
                    ok = ok or rules.get(alt[5:], "none") != "none"
                else:
                    ok = ok or props.get(alt) is True
            if not ok:
                missing.append(claim)
        return missing

    @staticmethod
    def refused_as_claimed(case: Case, ex: dict) -> bool:
        """The case's attack is a policy corral must refuse (REFUSED_BY), and it does."""
        r = ex.get("refused") or {}
        return (not ex.get("runs") and case.refused_by is not None
                and r.get("kind") == "policy" and r.get("field") == case.refused_by)

    def expectation(self, case: Case, tier: str) -> tuple[bool, str]:
        ex = self.explain(self.policy_for(case, tier))
        if self.refused_as_claimed(case, ex):
            return True, f"claimed: corral refuses the policy ({case.refused_by})"
        if not ex.get("runs"):
            r = ex.get("refused") or {}
            return False, f"refused by tier: {r.get('field')}: {r.get('message')}"
        missing = self.holds(case.claims, ex)
        if missing:
            return False, "not claimed here: " + ", ".join(missing)
        return True, "claimed: " + ", ".join(case.claims)

    # --- running -----------------------------------------------------------------

    def run_sandbox(self, tier: str, policy: dict, code: str, tty: bool = False,
                    nohup: bool = False) -> Obs:
        from ..policy import dump_toml, policy_from_dict

        obs = Obs("sandbox", tier, policy)
        with tempfile.NamedTemporaryFile("w", suffix=".toml", delete=False) as f:
            f.write(dump_toml(policy_from_dict(policy)))
            pfile = f.name
        env = dict(os.environ, CORRAL_PROBE_SECRET=self.cn.token,
                   SSH_AUTH_SOCK=self.cn.agent_path, CORRAL_AUDIT_FACE="probe")
        cmd = [sys.executable, "-m", "corral.cli", "run", "--policy", pfile,
               *([] if tty else ["--json"]), "--", PY, "-c", prelude.build(code, self.consts)]
        if nohup:
            cmd = [PY, "-c", NOHUP_WRAPPER, *cmd]
        limit = _seconds(policy.get("limits", {}).get("timeout", "60s")) + 30
        self.cn.replant()
        self.cn.sink.take()
        self.cn.take_dns()
        t0 = time.monotonic()
        if tty:
            try:
                obs.rc, obs.stdout = _on_terminal(cmd, env, self.cn.passed_fds, limit)
            finally:
                os.unlink(pfile)
            obs.wall = time.monotonic() - t0
            if obs.rc is None or obs.rc < 0:
                obs.crashed = f"corral run on a terminal ended with {obs.rc}"
            self._observe(obs)
            return obs
        try:
            p = subprocess.run(cmd, env=env, stdin=subprocess.DEVNULL, capture_output=True,
                               pass_fds=self.cn.passed_fds, timeout=limit)
            obs.rc = p.returncode
            out, obs.supervisor_stderr = p.stdout.decode(errors="replace"), p.stderr.decode(
                errors="replace")
        except subprocess.TimeoutExpired as e:
            obs.crashed = f"the supervisor did not return within {limit:.0f}s"
            out, obs.supervisor_stderr = (e.stdout or b"").decode(errors="replace"), ""
        finally:
            os.unlink(pfile)
        obs.wall = time.monotonic() - t0
        doc = None
        if out.strip():
            try:
                doc = json.loads(out.strip().splitlines()[-1])
            except ValueError:
                doc = None
        if isinstance(doc, dict) and "error" in doc:
            obs.error = doc["error"]
        elif isinstance(doc, dict) and "verdict" in doc:
            obs.result = doc
            obs.stdout, obs.stderr = doc.get("stdout", ""), doc.get("stderr", "")
        elif obs.crashed is None:
            how = (f"killed by signal {-obs.rc}" if obs.rc is not None and obs.rc < 0
                   else f"exit {obs.rc}")
            obs.crashed = f"the supervisor ended without a Result ({how})"
        self._observe(obs)
        return obs

    def run_host(self, code: str, tty: bool = False, nohup: bool = False) -> Obs:
        """A host control: the same code in a throw-away process as the probe's user, with
        HOME at the fake home; in a mount namespace of its own when root."""
        obs = Obs("host", "host", {})
        scratch = tempfile.mkdtemp(prefix="corral-probe-ctl-")
        env = {"PATH": "/usr/bin:/bin:/usr/sbin:/sbin", "HOME": self.cn.home,
               "PROBE_SCRATCH": scratch, "PROBE_DATA": self.cn.data, "LANG": "C.UTF-8",
               "CORRAL_PROBE_SECRET": self.cn.token, "SSH_AUTH_SOCK": self.cn.agent_path}
        cmd = [PY, "-c", prelude.build(code, self.consts)]
        if os.geteuid() == 0 and shutil.which("unshare"):
            cmd = ["unshare", "--mount", "--propagation", "private", "--"] + cmd
        if nohup:
            cmd = [PY, "-c", NOHUP_WRAPPER, *cmd]
        self.cn.replant()
        self.cn.sink.take()
        self.cn.take_dns()
        t0 = time.monotonic()
        if tty:
            try:
                obs.rc, obs.stdout = _on_terminal(cmd, env, self.cn.passed_fds,
                                                  CONTROL_LIMIT_S, cwd=scratch)
            finally:
                shutil.rmtree(scratch, ignore_errors=True)
            obs.wall = time.monotonic() - t0
            self._observe(obs)
            return obs
        try:
            p = subprocess.run(cmd, env=env, cwd=scratch, stdin=subprocess.DEVNULL,
                               capture_output=True, pass_fds=self.cn.passed_fds,
                               timeout=CONTROL_LIMIT_S, start_new_session=True)
            obs.rc = p.returncode
            obs.stdout = p.stdout.decode(errors="replace")
            obs.stderr = p.stderr.decode(errors="replace")
        except subprocess.TimeoutExpired as e:
            obs.stdout = (e.stdout or b"").decode(errors="replace")
            obs.crashed = f"the host control did not finish within {CONTROL_LIMIT_S:.0f}s"
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
        obs.wall = time.monotonic() - t0
        self._observe(obs)
        return obs

    def _observe(self, obs: Obs) -> None:
        self.cn.settle()  # the sinks have recorded the run's last bytes, however slow
        obs.sink = self.cn.sink.take()
        obs.dns = self.cn.take_dns()
        obs.changed = self.cn.changed()
        obs.escaped = os.path.lexists(self.cn.marker)
        obs.leftover = _leftovers(f"corral-probe-daemon-{self.cn.run_id}")
        for pid in obs.leftover:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass

    # --- scoring -----------------------------------------------------------------

    def evidence(self, obs: Obs) -> str | None:
        """READ / WRITE / ESCAPE / CRASH seen outside, whatever the case."""
        t, d = self.cn.token, self.cn.data
        places = {"stdout": obs.stdout, "stderr": obs.stderr,
                  "events": json.dumps(obs.events), "supervisor stderr": obs.supervisor_stderr,
                  "the first run's output": obs.earlier}
        where = [k for k, v in places.items() if t in v]
        sink = obs.sink.decode("latin-1")
        if t in sink or d in sink:
            where.append("the TCP/UDP sink")
        if t in obs.dns.lower() or d in obs.dns.lower():
            where.append("the DNS sink")
        if where:
            return "READ: canary reached " + ", ".join(where)
        if obs.changed:
            return "WRITE: host file " + "; ".join(obs.changed[:3])
        if obs.escaped:
            return "ESCAPE: the marker file was created on the host"
        if obs.leftover:
            return f"ESCAPE: {len(obs.leftover)} process(es) of the run outlived it"
        if obs.crashed:
            return "CRASH: " + obs.crashed
        return None

    def score(self, case: Case, obs: Obs) -> tuple[bool | None, str]:
        ev = self.evidence(obs)
        if ev:
            return False, ev
        if case.score is not None:
            contained, reason = case.score(obs)
            denied = _wasi_denial(obs.stderr) if obs.tier == "wasm" else None
            if contained is None and denied:
                return True, f"denied by WASI (no such capability): {denied}"
            return contained, reason
        unsupported = obs.tag("UNSUPPORTED")
        if unsupported is not None:
            return None, "unsupported: " + unsupported
        allowed = obs.tag("ALLOWED")
        if allowed is not None:
            return False, allowed
        denied = [d for t, d in obs.tags() if t == "DENIED"]
        if denied:
            return True, "; ".join(denied[:3])
        if obs.tier == "wasm":
            denied = _wasi_denial(obs.stderr)
            if denied:   # nothing seen outside, and WASI stopped the attack's first step
                return True, f"denied by WASI (no such capability): {denied}"
        return None, "inconclusive: no PROBE line (" + _tail(obs.stderr) + ")"

    # --- one cell --------------------------------------------------------------------

    def control(self, case: Case, tier: str) -> tuple[str, str] | None:
        """None when the positive control succeeded, else (status, reason)."""
        ctl = case.control
        if ctl == "host" or (isinstance(ctl, dict) and ctl.get("where") == "host"):
            code = case.code if ctl == "host" else ctl["code"]
            key = (case.id, code)
            if key not in self._host_controls:
                obs = self.run_host(code, tty=case.tty, nohup=case.nohup)
                self._host_controls[key] = (obs, self.score(case, obs))
            obs, (contained, reason) = self._host_controls[key]
        else:
            pol = control_limits(self.policy_for(case, tier, ctl.get("policy")))
            code = ctl.get("code", case.code)
            if case.second and "code" not in ctl:
                obs = self._run_twice(tier, pol, case)
            else:
                obs = self.run_sandbox(tier, pol, code, tty=case.tty, nohup=case.nohup)
            if obs.error:
                return REFUSED if obs.error.get("kind") in ("unsupported", "unavailable") else \
                    INVALID, f"control could not run: {obs.error.get('message')}"
            contained, reason = self.score(case, obs)
        if contained is False:
            return None
        if contained is None and reason.startswith("unsupported"):
            return UNSUPPORTED, f"control: {reason}"
        return INVALID, f"positive control did not succeed ({reason})"

    def _run_twice(self, tier: str, pol: dict, case: Case) -> Obs:
        first = self.run_sandbox(tier, pol, case.code)
        if first.error:
            return first
        second = self.run_sandbox(tier, pol, case.second)
        second.earlier = first.stdout + first.stderr
        second.changed = first.changed + second.changed
        second.sink = first.sink + second.sink
        second.dns = first.dns + second.dns
        second.escaped = first.escaped or second.escaped
        return second

    def cell(self, case: Case, tier: str) -> Cell:
        na = not_applicable(case, tier)
        if na is not None:
            return Cell(case, tier, False, UNSUPPORTED, None, f"not applicable on {tier}: {na}")
        if case.install is not None:   # through `corral install`, not one `corral run`
            from .install_phase import cell

            return cell(self, case, tier)
        t0 = time.monotonic()
        expected, why = self.expectation(case, tier)

        def done(status, contained, reason):
            return Cell(case, tier, expected, status, contained, reason,
                        time.monotonic() - t0)

        pol = self.policy_for(case, tier)
        ex = self.explain(pol)
        if self.refused_as_claimed(case, ex):   # the control still shows the attack works
            bad = self.control(case, tier)
            if bad:
                return done(bad[0], None, bad[1])
            return done(CONTAINED, True, f"corral refuses the policy: {ex['refused']['message']}")
        if not ex.get("runs"):
            if ex["refused"].get("kind") not in ("unsupported", "unavailable"):
                return done(INVALID, None, f"the case's policy is wrong: {why}")
            return done(REFUSED, None, why)
        if case.safety:
            missing = self.holds(case.safety, ex)
            if missing:
                return done(NOT_RUN, False, "not run (unsafe here): the tier does not "
                            "enforce " + ", ".join(missing))
        bad = self.control(case, tier)
        if bad and bad[0] == INVALID and tier == "wasm" and not _host_control(case):
            # the attack fails in the WASI guest even with the rule off: nothing to contain
            return done(UNSUPPORTED, None, "not applicable on wasm: the attack does not work "
                        f"in the WASI guest even with the rule off ({bad[1]})")
        if bad:
            return done(bad[0], None, bad[1])
        obs = self._run_twice(tier, pol, case) if case.second else self.run_sandbox(
            tier, pol, case.code, tty=case.tty, nohup=case.nohup)
        if obs.error:
            kind = obs.error.get("kind")
            status = REFUSED if kind in ("unsupported", "unavailable") else INVALID
            return done(status, None, f"{'refused by tier' if status == REFUSED else 'corral error'}"
                        f": {obs.error.get('message')}")
        contained, reason = self.score(case, obs)
        if contained is None:
            status = UNSUPPORTED if reason.startswith("unsupported") else INCONCLUSIVE
        else:
            status = CONTAINED if contained else NOT_CONTAINED
        return done(status, contained, reason)


#: what a case's code uses that the wasm tier's guest (CPython for WASI) does not have
WASM_NEEDS = (("subprocess", "a subprocess"), ("os.fork", "fork"), ("os.exec", "exec"),
              ("os.system", "a shell"), ("os.spawn", "a subprocess"), ("/bin/sh", "a shell"),
              ("pty.", "a pty"), ("threading", "threads"), ("multiprocessing", "processes"),
              ("os.kill", "signals"), ("signal.signal", "signals"), ("mmap", "mmap"),
              ("fcntl", "fcntl"), ("ctypes.", "ctypes (raw syscalls)"),
              ("libc.", "libc (native calls)"),
              ("process_time", "a CPU-time clock (WASI's is not the host's CPU time; "
               "tests/particular/test_wasm.py stops a spin at the CPU limit)"))


#: how CPython for WASI reports a path outside every preopen or a right it was not given
WASI_DENIALS = ("FileNotFoundError: [Errno 44]", "PermissionError: [Errno 63]",
                "PermissionError: [Errno 2]", "OSError: [Errno 58] Not supported",
                "OSError: [Errno 76]",
                # the call or the socket family does not exist in the guest at all
                "AttributeError: module 'socket' has no attribute",
                "AttributeError: module '_socket' has no attribute",
                "AttributeError: module 'os' has no attribute")


def _host_control(case: Case) -> bool:
    ctl = case.control
    return ctl == "host" or (isinstance(ctl, dict) and ctl.get("where") == "host")


def _wasi_denial(stderr: str) -> str | None:
    """The guest's last line when the wasm guest died of a WASI refusal (no preopen holds
    the path, no right to it, no such function), else None."""
    lines = [ln for ln in stderr.strip().splitlines() if ln.strip()]
    last = lines[-1] if lines else ""
    return last[:200] if last.startswith(WASI_DENIALS) else None


def not_applicable(case: Case, tier: str) -> str | None:
    """Why a case cannot run on a tier at all (scored "n/a", never a pass), or None. The
    wasm tier runs Python code only, in a WASI guest without processes, threads, signals,
    terminals or native calls: a case whose attack needs one of them has nothing to try."""
    if tier == "microvm":
        if case.tty:
            return "it needs a terminal (corral run -t), which the microvm tier does not offer"
        if case.install is not None:
            return ("it runs the image corral install makes (layers over a base), and the "
                    "microvm tier boots an image's base tree only, not layers yet")
        return None
    if tier != "wasm":
        return None
    if case.tty:
        return "it needs a terminal; the wasm tier offers none"
    if case.install is not None:
        return "it runs the install phase (pip in a shell); the wasm tier runs Python code only"
    if case.nohup:
        return "its caller is a shell wrapper; the wasm tier runs Python code only"
    for needle, what in WASM_NEEDS:
        if needle in case.code:
            return f"its attack needs {what}, which the WASI guest does not have"
    return None


def control_limits(policy: dict) -> dict:
    """A control's policy with limits.timeout and limits.cpu_time raised to at least
    CONTROL_LIMIT_S (a shorter one the case or its control names is raised too: the
    control must never be the run a slow machine cuts short)."""
    limits = dict(policy.get("limits", {}))
    for key in ("timeout", "cpu_time"):
        if _seconds(limits.get(key, "0s")) < CONTROL_LIMIT_S:
            limits[key] = f"{CONTROL_LIMIT_S:g}s"
    return {**policy, "limits": limits}


def _on_terminal(cmd, env, fds, limit, cwd=None) -> tuple[int | None, str]:
    """Run cmd with stdout and stderr on a new pseudo-terminal; what the terminal got."""
    import fcntl
    import pty
    import select
    import termios

    def controlling_terminal() -> None:  # as a login shell has it: /dev/tty is this pty
        fcntl.ioctl(1, termios.TIOCSCTTY, 0)

    master, slave = pty.openpty()
    p = subprocess.Popen(cmd, env=env, cwd=cwd, stdin=subprocess.DEVNULL, stdout=slave,
                         stderr=slave, pass_fds=fds, start_new_session=True,
                         preexec_fn=controlling_terminal)
    os.close(slave)
    got = bytearray()
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        r, _, _ = select.select([master], [], [], 0.2)
        if r:
            try:
                b = os.read(master, 65536)
            except OSError:  # EIO: every writer closed the terminal
                break
            if not b:
                break
            got += b
        elif p.poll() is not None:
            break
    os.close(master)
    try:
        rc = p.wait(5)
    except subprocess.TimeoutExpired:
        p.kill()
        rc = p.wait()
    return rc, got.decode("utf-8", "replace")


def _leftovers(marker: str) -> list[int]:
    pids = []
    mb = marker.encode()
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/cmdline", "rb") as f:
                    if mb in f.read():
                        pids.append(int(d))
            except OSError:
                continue
    return pids


def _tail(text: str, n: int = 160) -> str:
    lines = [x for x in text.strip().splitlines() if x.strip()]
    return (lines[-1][:n] if lines else "no output")


def _seconds(v) -> float:
    if isinstance(v, (int, float)):
        return float(v)
    s = str(v).strip()
    for unit, mul in (("ms", 0.001), ("s", 1), ("m", 60), ("h", 3600)):
        if s.endswith(unit) and s[: -len(unit)].replace(".", "", 1).isdigit():
            return float(s[: -len(unit)]) * mul
    return 60.0
