"""The batch job model: what one line of JOBS.jsonl (or one dict of corral.batch.map) may
say, checked strictly, and the job's own policy within the batch's.

    {"id": "t-17", "argv": ["python3", "-c", "print(1)"]}
    {"id": 18, "code": "print(input())", "stdin": "hi\\n", "files": {"data.txt": "..."},
     "policy": {"limits": {"timeout": "5s"}}}

`id` (a string or an integer) names the job in the results and makes it idempotent: a
batch runs each id once, and a re-run with the same output file skips ids already there.
`argv` (a list of strings) or `code` (Python source, run as `python3 -c CODE`), never both;
`stdin` (text) is the command's standard input; `files` (relative path -> text) are written
into the sandbox's working directory first; `policy` overrides keys of the batch's policy,
and may only narrow it (policy/narrow.py). A malformed job is a UsageError naming where it
is (file:line or job N) and the field; a job whose policy widens the batch's is refused on
its own (a PolicyError in its result), the others run.
"""

from __future__ import annotations

from .._record import Record
from ..errors import PolicyError, UsageError

#: bounds of one job (the driver holds every job of a batch in memory)
MAX_ID = 256
MAX_ARGV_BYTES = 1 << 20
MAX_CODE = 1 << 20
MAX_STDIN = 16 << 20
MAX_FILES = 1000
MAX_FILES_BYTES = 64 << 20
MAX_PATH = 4096
MAX_LINE = 96 << 20
KEYS = ("id", "argv", "code", "stdin", "files", "policy")


class Job(Record):
    id: str | int
    argv: tuple[str, ...]
    stdin: str | None = None
    files: tuple[tuple[str, str], ...] = ()
    policy: dict | None = None       # overrides, in the TOML layout

    def key(self) -> str:
        """The id as output lines and resume compare it."""
        return _id_key(self.id)

    def to_wire(self) -> dict:
        """The job as a plain dict (what travels to a node, which checks it again)."""
        d: dict = {"id": self.id, "argv": list(self.argv)}
        if self.stdin is not None:
            d["stdin"] = self.stdin
        if self.files:
            d["files"] = dict(self.files)
        if self.policy:
            d["policy"] = self.policy
        return d


def _id_key(v) -> str:
    return f"s:{v}" if isinstance(v, str) else f"i:{v}"


def id_key(v) -> str | None:
    """The comparable key of an id read back from an output line (None: not an id)."""
    if isinstance(v, str) and 0 < len(v) <= MAX_ID:
        return _id_key(v)
    if isinstance(v, int) and not isinstance(v, bool):
        return _id_key(v)
    return None


def parse_job(raw, where: str) -> Job:
    """A Job from a decoded JSON object; UsageError naming `where` and the field."""
    def bad(field: str, why: str) -> UsageError:
        return UsageError(why, field=f"{where}: {field}")

    if not isinstance(raw, dict):
        raise UsageError("a job is a JSON object {\"id\": ..., \"argv\": [...]}",
                         field=where)
    for k in raw:
        if k not in KEYS:
            raise bad(str(k)[:64], f"unknown key; a job has {', '.join(KEYS)}")
    if "id" not in raw:
        raise bad("id", "missing; give every job a unique id (a string or an integer)")
    jid = raw["id"]
    if id_key(jid) is None or (isinstance(jid, str) and ("\0" in jid or "\n" in jid)):
        raise bad("id", f"expected a string of 1-{MAX_ID} characters (no NUL or newline) "
                        f"or an integer")
    if ("argv" in raw) == ("code" in raw):
        raise bad("argv", "give exactly one of argv (a list of strings) or code (Python "
                          "source)")
    if "argv" in raw:
        argv = raw["argv"]
        if not isinstance(argv, list) or not argv or not all(
                isinstance(a, str) and "\0" not in a for a in argv) or not argv[0]:
            raise bad("argv", "expected a non-empty list of strings without NUL")
        if sum(len(a.encode("utf-8", "surrogateescape")) + 1 for a in argv) > MAX_ARGV_BYTES:
            raise bad("argv", f"longer than {MAX_ARGV_BYTES} bytes; pass data in files")
        argv = tuple(argv)
    else:
        code = raw["code"]
        if not isinstance(code, str) or "\0" in code or len(code) > MAX_CODE:
            raise bad("code", f"expected Python source as a string (no NUL, at most "
                              f"{MAX_CODE} characters)")
        argv = ("python3", "-c", code)
    stdin = raw.get("stdin")
    if stdin is not None and (not isinstance(stdin, str) or len(stdin) > MAX_STDIN):
        raise bad("stdin", f"expected text (a string) of at most {MAX_STDIN} characters")
    files = raw.get("files") or {}
    if not isinstance(files, dict) or len(files) > MAX_FILES:
        raise bad("files", f"expected an object of at most {MAX_FILES} relative paths to "
                           f"text")
    total = 0
    for path, text in files.items():
        if (not path or len(path) > MAX_PATH or "\0" in path or path.startswith("/")
                or ".." in path.split("/")):
            raise bad(f"files[{path[:64]!r}]", "expected a relative path (no NUL, no '..', "
                                               "at most 4096 characters)")
        if not isinstance(text, str):
            raise bad(f"files[{path[:64]!r}]", "expected the file's text as a string")
        total += len(text)
    if total > MAX_FILES_BYTES:
        raise bad("files", f"more than {MAX_FILES_BYTES} characters in all")
    policy = raw.get("policy")
    if policy is not None and not isinstance(policy, dict):
        raise bad("policy", "expected an object of policy keys (the TOML layout), e.g. "
                            "{\"limits\": {\"timeout\": \"5s\"}}")
    return Job(id=jid, argv=argv, stdin=stdin, files=tuple(files.items()),
               policy=policy or None)


def read_jobs(path: str) -> list[Job]:
    """Every job of a JSONL file (blank lines skipped), checked; ids unique."""
    import json

    jobs: list[Job] = []
    seen: dict[str, int] = {}
    try:
        f = open(path, "rb")
    except OSError as e:
        raise UsageError(f"cannot read {path!r}: {e.strerror}", field="JOBS") from None
    with f:
        for n, line in enumerate(f, 1):
            where = f"{path}:{n}"
            if len(line) > MAX_LINE:
                raise UsageError(f"longer than {MAX_LINE} bytes", field=where)
            if not line.strip():
                continue
            try:
                raw = json.loads(line)
            except (ValueError, UnicodeDecodeError) as e:
                raise UsageError(f"not a JSON object ({e})", field=where) from None
            job = parse_job(raw, where)
            if job.key() in seen:
                raise UsageError(f"id {job.id!r} is also on line {seen[job.key()]}; ids "
                                 f"must be unique", field=f"{where}: id")
            seen[job.key()] = n
            jobs.append(job)
    return jobs


def check_jobs(jobs) -> list[Job]:
    """Jobs from dicts (or Jobs) of the Python API, checked; ids unique."""
    out: list[Job] = []
    seen: dict[str, int] = {}
    for i, raw in enumerate(jobs):
        where = f"job {i}"
        job = raw if isinstance(raw, Job) else parse_job(raw, where)
        if job.key() in seen:
            raise UsageError(f"id {job.id!r} is also job {seen[job.key()]}'s; ids must be "
                             f"unique", field=f"{where}: id")
        seen[job.key()] = i
        out.append(job)
    return out


def base_policy(policy) -> dict:
    """The batch's policy as the dict that travels with each job (the TOML layout, only
    the keys that were set, so what was explicit stays explicit on every node): from a
    dict, a TOML file path, a Policy, or None. Checked here: a PolicyError is raised now."""
    import os

    from ..policy import policy_from_dict
    from ..policy.schema import Policy

    if policy is None:
        data: dict = {}
    elif isinstance(policy, dict):
        data = policy
    elif isinstance(policy, Policy):
        data = policy_to_dict(policy)
    else:
        from ..policy.load import read_toml

        data = read_toml(os.fspath(policy))
    policy_from_dict(data)
    return data


def policy_to_dict(policy) -> dict:
    """A Policy's explicit keys as a dict the loader reads back to the same Policy."""
    from ..policy.dump import get_value
    from ..policy.schema import SPEC_BY_PATH

    out: dict = {}
    for path in sorted(policy.explicit):
        if path == "secrets":
            continue
        value = get_value(policy, path)
        kind = SPEC_BY_PATH[path].kind if path in SPEC_BY_PATH else ""
        if kind == "envset":
            value = dict(value)
        elif kind == "workspace" and value is not None:
            value = {"path": value.path, "mode": value.mode, "mount_at": value.mount_at}
        elif isinstance(value, tuple):
            value = list(value)
        *tables, key = path.split(".")
        d = out
        for t in tables:
            d = d.setdefault(t, {})
        d[key] = value
    if policy.secrets:
        out["secrets"] = {s.name: {**({"value": s.value} if s.source == "literal"
                                      else {"from": s.source}),
                                   "hosts": list(s.hosts), "ttl": s.ttl,
                                   "plain_http": s.plain_http} for s in policy.secrets}
    return out


def job_policy(base: dict, job: Job):
    """The job's effective Policy: the batch's with the job's overrides laid on it,
    checked, and refused (PolicyError naming `policy.KEY`) if it widens the batch's."""
    from ..policy import merge, policy_from_dict
    from ..policy.narrow import widening

    batch = policy_from_dict(base)
    if not job.policy:
        return batch
    try:
        mine = policy_from_dict(merge(base, job.policy))
    except PolicyError as e:
        raise PolicyError(e.message, field=f"policy.{e.field}" if e.field else "policy") \
            from None
    wider = widening(batch, mine)
    if wider is not None:
        key, why = wider
        raise PolicyError(f"the job's policy widens the batch's: {why}; a job may only "
                          f"narrow it", field=f"policy.{key}")
    return mine


__all__ = ["Job", "base_policy", "check_jobs", "id_key", "job_policy", "parse_job",
           "policy_to_dict", "read_jobs"]
