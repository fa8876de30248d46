"""Building a Policy from TOML, a dict, or command-line overrides, with one-line errors.

Every source becomes a nested dict first; they are merged (later wins, key by key), then
validated once. Unknown keys are errors, so a typo can never silently mean a default.
"""

from __future__ import annotations

import os

from ..errors import PolicyError
from .schema import (
    FIELDS,
    SECTIONS,
    SPEC_BY_PATH,
    TIERS,
    WORKSPACE_AT,
    Audit,
    Batch,
    Budget,
    Env,
    Filesystem,
    Install,
    Limits,
    Network,
    Policy,
    Secret,
    Spec,
    Workspace,
)
from .units import parse_duration, parse_size

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

_NAME_START = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz_")
_NAME_CHARS = _NAME_START | frozenset("0123456789")


def _is_env_name(name: object) -> bool:
    return (isinstance(name, str) and name != "" and name[0] in _NAME_START
            and all(c in _NAME_CHARS for c in name))
#: paths inside the sandbox that corral builds itself: a bind or workspace may not replace
#: one. A path *below* /tmp or /scratch is fine (it is mounted on top of the sandbox's own
#: tmpfs, at the same path); below the SEALED ones it is not (the host's kernel trees stay
#: hidden, /etc is corral's minimal one, /workspace holds the workspace)
_BUILT = ("/", "/tmp", "/proc", "/dev", "/sys", "/etc", "/scratch", "/workspace")
_SEALED = ("/proc", "/dev", "/sys", "/etc")
def _keys_below(prefix: str) -> set[str]:
    """The keys directly below a table path: limits -> memory, ...; network -> budget, ..."""
    return {f.path[len(prefix) + 1:].split(".")[0] for f in FIELDS
            if f.path.startswith(prefix + ".")}


def merge(base: dict, over: dict) -> dict:
    """A new dict: `over` laid on `base`, tables merged key by key."""
    out = dict(base)
    for k, v in over.items():
        if isinstance(v, dict) and isinstance(out.get(k), dict) and k != "set":
            out[k] = merge(out[k], v)
        else:
            out[k] = v
    return out


def read_toml(path: str) -> dict:
    import tomllib

    try:
        with open(path, "rb") as f:
            return tomllib.load(f)
    except FileNotFoundError:
        raise PolicyError(f"policy file {path!r} does not exist; check the --policy path",
                          field="--policy") from None
    except (IsADirectoryError, PermissionError) as e:
        raise PolicyError(f"cannot read policy file {path!r}: {e.strerror}",
                          field="--policy") from None
    except tomllib.TOMLDecodeError as e:
        raise PolicyError(f"{path}: not valid TOML ({e}); fix the syntax",
                          field="--policy") from None
    except UnicodeDecodeError:
        raise PolicyError(f"{path}: not UTF-8 text", field="--policy") from None


def load_policy(file: str | None = None, overrides: dict | None = None,
                base: dict | None = None) -> Policy:
    """The effective policy: defaults <- base dict <- TOML file <- overrides (flags)."""
    data: dict = dict(base or {})
    if file is not None:
        data = merge(data, read_toml(file))
    if overrides:
        data = merge(data, overrides)
    return policy_from_dict(data, allow_literal=False)


def policy_from_dict(data: dict, *, allow_literal: bool = True) -> Policy:
    """`allow_literal`: a secret may carry its value inline (the Python API); files and
    flags name a source instead (load_policy passes False)."""
    if not isinstance(data, dict):
        raise PolicyError("a policy is a table (dict) of sections", field="policy")
    explicit: set[str] = set()
    for key in data:
        if key not in ("isolation", "image", *SECTIONS, "secrets"):
            raise PolicyError(_unknown(key, ("isolation", "image", *SECTIONS, "secrets")),
                              field=key)
    values: dict[str, Any] = {}
    if "isolation" in data:
        values["isolation"] = _convert(SPEC_BY_PATH["isolation"], data["isolation"], "isolation")
        explicit.add("isolation")
    if "image" in data:
        values["image"] = _convert(SPEC_BY_PATH["image"], data["image"], "image")
        explicit.add("image")
    def walk(prefix: str, table: Any) -> None:
        if not isinstance(table, dict):
            raise PolicyError(f"[{prefix}] must be a table", field=prefix)
        for key, raw in table.items():
            path = f"{prefix}.{key}"
            spec = SPEC_BY_PATH.get(path)
            if spec is not None:
                values[path] = _convert(spec, raw, path)
                explicit.add(path)
            elif key in _keys_below(prefix):
                walk(path, raw)  # a sub-table such as network.budget
            else:
                raise PolicyError(_unknown(key, sorted(_keys_below(prefix))), field=path)

    for section in SECTIONS:
        walk(section, data.get(section, {}))

    def pick(section: str, cls: type, rename: dict | None = None, **sub: Any) -> Any:
        kw = dict(sub)
        for path, v in values.items():
            if path.startswith(section + ".") and "." not in path[len(section) + 1:]:
                name = path[len(section) + 1:]
                kw[(rename or {}).get(name, name)] = v
        return cls(**kw)

    policy = Policy(
        isolation=values.get("isolation", "namespace"),
        image=values.get("image", "host"),
        limits=pick("limits", Limits),
        filesystem=pick("filesystem", Filesystem),
        env=pick("env", Env, {"pass": "pass_"}),
        network=pick("network", Network, budget=pick("network.budget", Budget)),
        install=pick("install", Install),
        audit=pick("audit", Audit),
        batch=pick("batch", Batch),
        secrets=_secrets(data.get("secrets", {}), allow_literal),
        explicit=frozenset(explicit | ({"secrets"} if data.get("secrets") else set())),
    )
    _check_network(policy)
    ws = policy.filesystem.workspace
    if ws is not None and ws.mount_at == "same" and ws.path in policy.filesystem.ro_binds:
        i = policy.filesystem.ro_binds.index(ws.path)
        raise PolicyError(f"{ws.path!r} is the workspace itself (mount_at = \"same\"); "
                          f"drop it from ro_binds or mount the workspace ro",
                          field=f"filesystem.ro_binds[{i}]")
    if policy.install.requested() and policy.image == "host":
        raise PolicyError("[install] needs image = \"BASE\": the image to install into "
                          "(e.g. \"python\"); the host's root cannot take packages",
                          field="install")
    return policy


def _secrets(raw: Any, allow_literal: bool) -> tuple[Secret, ...]:
    if not isinstance(raw, dict):
        raise PolicyError("[secrets] must be a table of [secrets.NAME] tables", field="secrets")
    out = []
    for name, table in raw.items():
        f = f"secrets.{name}"
        if not _is_env_name(name):
            raise PolicyError(f"{name!r} is not a variable name (letters, digits, _)", field=f)
        if not isinstance(table, dict):
            raise PolicyError("expected a table with from, hosts, ttl, plain_http", field=f)
        known = ("from", "hosts", "ttl", "plain_http") + (("value",) if allow_literal else ())
        for k in table:
            if k not in known:
                hint = ("; a literal value is accepted only from the Python API: name a "
                        "source with from = \"env:VAR\" or \"file:PATH\"") if k == "value" else ""
                raise PolicyError(_unknown(k, known) + hint, field=f"{f}.{k}")
        if "value" in table:
            if "from" in table:
                raise PolicyError("give either from or value, not both", field=f"{f}.from")
            value = table["value"]
            if not isinstance(value, str) or not value:
                raise PolicyError("the value must be a non-empty string", field=f"{f}.value")
            source = "literal"
        else:
            value = None
            source = table.get("from")
            if not isinstance(source, str) or not (
                    source.startswith("env:") and _is_env_name(source[4:])
                    or source.startswith("file:/") and "\0" not in source):
                raise PolicyError(f"{source!r} is not a source; write \"env:VAR\" or "
                                  f"\"file:/abs/path\"", field=f"{f}.from")
        hosts = table.get("hosts")
        if not isinstance(hosts, list) or not hosts or not all(
                isinstance(h, str) for h in hosts):
            raise PolicyError("expected a non-empty list of hosts, e.g. [\"api.github.com\"]",
                              field=f"{f}.hosts")
        try:
            ttl = parse_duration(table.get("ttl", "15m"))
        except ValueError as e:
            raise PolicyError(str(e), field=f"{f}.ttl") from None
        if not 1 <= ttl <= 7 * 86400:
            raise PolicyError("use a ttl from 1s to 7 days", field=f"{f}.ttl")
        plain = table.get("plain_http", False)
        if not isinstance(plain, bool):
            raise PolicyError("expected true or false", field=f"{f}.plain_http")
        out.append(Secret(name=name, source=source, hosts=tuple(hosts), ttl=ttl,
                          plain_http=plain, value=value))
    return tuple(out)


def _check_network(p: Policy) -> None:
    """Rules need the proxy; every rule must parse (egress/config.py owns the grammar);
    a grant's hosts must be hosts the allow list opens."""
    n = p.network
    for s in p.secrets:
        if n.mode != "allow":
            raise PolicyError("a secret grant needs the egress proxy; set network.mode = "
                              "\"allow\" and allow its hosts", field=f"secrets.{s.name}")
        if s.name in dict(p.env.set) or s.name in p.env.pass_:
            raise PolicyError(f"{s.name} is also set by [env]; the sandbox sees the "
                              f"placeholder in it, so drop it from [env]",
                              field=f"secrets.{s.name}")
    if n.mode == "none":
        for key in ("allow", "allow_private", "nameservers"):
            if getattr(n, key):
                raise PolicyError("rules need the egress proxy; set network.mode = \"allow\" "
                                  "(the --allow-domain flag does)", field=f"network.{key}")
        return
    from .hosts import is_metadata_name
    from .rules import admits, parse_cidr, parse_nameserver, parse_rule

    allow = [parse_rule(r, f"network.allow[{i}]") for i, r in enumerate(n.allow)]
    deny = [parse_rule(r, f"network.deny[{i}]") for i, r in enumerate(n.deny)]
    for i, r in enumerate(n.allow_private):
        parse_cidr(r, f"network.allow_private[{i}]")
    for i, r in enumerate(n.nameservers):
        parse_nameserver(r, f"network.nameservers[{i}]")
    for s in p.secrets:
        for i, h in enumerate(s.hosts):
            f = f"secrets.{s.name}.hosts[{i}]"
            rule = parse_rule(h, f)
            if rule.kind == "host":
                port = rule.ports[0] if rule.ports else 443
                found = admits(allow, deny, rule.name, port)
                if found is None or found[0] == "deny" or is_metadata_name(rule.name):
                    raise PolicyError(f"{h} is not let through by network.allow; add "
                                      f"\"{rule.name}\" to network.allow", field=f)


def _unknown(key: str, known) -> str:
    import difflib

    near = difflib.get_close_matches(str(key), list(known), n=1)
    hint = f"did you mean {near[0]!r}?" if near else f"known keys: {', '.join(known)}"
    return f"unknown key {key!r}; {hint}"


def _convert(spec: Spec, raw: Any, path: str) -> Any:
    try:
        value = _CONVERTERS[spec.kind](raw, path)
    except PolicyError:
        raise
    except (ValueError, TypeError) as e:
        raise PolicyError(str(e), field=path) from None
    if spec.minimum is not None and isinstance(value, (int, float)):
        if value < spec.minimum or (spec.maximum is not None and value > spec.maximum):
            from .dump import format_value

            lo = format_value(spec, spec.minimum)
            hi = format_value(spec, spec.maximum) if spec.maximum is not None else "no limit"
            raise PolicyError(f"{format_value(spec, value)} is out of range; "
                              f"use a value from {lo} to {hi}", field=path)
    return value


def _int(raw: Any, path: str) -> int:
    if isinstance(raw, bool) or not isinstance(raw, (int, str)):
        raise ValueError("expected a whole number")
    try:
        return int(raw)
    except ValueError:
        raise ValueError(f"{raw!r} is not a whole number") from None


def _bool(raw: Any) -> bool:
    if not isinstance(raw, bool):
        raise ValueError(f"expected true or false, not {raw!r}")
    return raw


def _float(raw: Any, path: str) -> float:
    if isinstance(raw, bool) or not isinstance(raw, (int, float, str)):
        raise ValueError("expected a number")
    try:
        v = float(raw)
    except OverflowError:               # an int past a float's range (JSON, a dict)
        raise ValueError("expected a finite number") from None
    except ValueError:
        raise ValueError(f"{raw!r} is not a number") from None
    if v != v or v in (float("inf"), float("-inf")):
        raise ValueError("expected a finite number")
    return v


def _tier(raw: Any, path: str) -> str:
    if raw not in TIERS:
        raise ValueError(f"unknown tier {raw!r}; use one of {', '.join(TIERS)}")
    return raw


def _netmode(raw: Any, path: str) -> str:
    if raw not in ("none", "allow"):
        raise ValueError(f"unknown network mode {raw!r}; use \"none\" or \"allow\"")
    return raw


def _image(raw: Any, path: str) -> str:
    """"host", an image name, or sha256:HEX (the store resolves it when a sandbox opens)."""
    import re

    if not isinstance(raw, str) or not (
            raw == "host" or re.fullmatch(r"[a-z0-9][a-z0-9._-]{0,62}", raw)
            or re.fullmatch(r"sha256:[0-9a-f]{64}", raw)):
        raise ValueError(f"{raw!r} is not \"host\", an image name (lower-case letters, "
                         "digits, '.', '_', '-') or sha256: and 64 hex digits")
    return raw


def _file(raw: Any, path: str) -> str:
    real = check_host_path(raw, path)
    if not os.path.isfile(real):
        raise PolicyError(f"{raw!r} is not a file", field=path)
    return real


def _strings(raw: Any, path: str) -> tuple[str, ...]:
    """A list of strings; their grammar is checked as a whole by _check_network."""
    if not isinstance(raw, (list, tuple)):
        raise ValueError("expected a list of strings")
    for i, v in enumerate(raw):
        if not isinstance(v, str):
            raise PolicyError(f"expected a string, got {type(v).__name__}", field=f"{path}[{i}]")
    return tuple(raw)


def check_host_path(raw: Any, field: str) -> str:
    """An absolute, existing host path without traps, returned fully resolved."""
    if not isinstance(raw, str) or not raw:
        raise PolicyError("expected an absolute path as a string", field=field)
    if "\0" in raw or "\n" in raw:
        raise PolicyError("a path may not contain NUL or newline characters", field=field)
    if not raw.startswith("/"):
        raise PolicyError(f"{raw!r} is relative; write an absolute path", field=field)
    if ".." in raw.split("/"):
        raise PolicyError(f"{raw!r} contains '..'; write the path without it", field=field)
    real = os.path.realpath(raw)
    if not os.path.exists(real):
        raise PolicyError(f"{raw!r} does not exist on this host", field=field)
    return real


#: host trees never mounted as a whole (a workspace or a bind inside them is fine)
SYSTEM_TREES = ("/", "/etc", "/usr", "/var", "/boot", "/root", "/proc", "/sys", "/dev", "/run")


def first_link(path: str) -> tuple[str, str] | None:
    """(component, its target) of the first symbolic link on the way to absolute `path`, or
    None. For error messages only: it looks by name (lstat); the sandbox builder opens the
    path again with no link followed (linux/hostpath.py), which is the guarantee."""
    import stat

    cur = ""
    for name in (p for p in path.split("/") if p and p != "."):
        cur += "/" + name
        try:
            if stat.S_ISLNK(os.lstat(cur).st_mode):
                return cur, os.readlink(cur)
        except OSError:
            return None
    return None


def check_mount_source(raw: Any, field: str, what: str) -> str:
    """check_host_path() for a path corral mounts (the workspace, a bind): not a system
    tree, and no symbolic link at any component (corral never follows one: see
    hostpath.py; the sandbox builder opens the path again without following any)."""
    real = check_host_path(raw, field)
    path = os.path.normpath(raw)
    if real != path:
        link, target = first_link(path) or (path, real)
        raise PolicyError(f"{raw!r} has a symbolic link in it ({link} -> {target}), and "
                          f"corral follows none; name the real path", field=field)
    if path in SYSTEM_TREES:
        raise PolicyError(f"{raw!r} is {'the host root, ' if path == '/' else ''}a system "
                          f"tree, which is never {what} as a whole "
                          f"({', '.join(SYSTEM_TREES)}); name a directory inside it",
                          field=field)
    return real


def check_mount_dest(dest: str, field: str, raw: str, *, sealed=_SEALED) -> None:
    """A path inside the sandbox where a host path is mounted must not replace a path
    corral builds itself (_BUILT) nor lie inside a sealed one."""
    if dest in _BUILT:
        raise PolicyError(f"{raw!r} would replace the sandbox's own {dest} (corral builds "
                          f"{', '.join(_BUILT)} itself); mount something else or a "
                          f"directory inside it", field=field)
    for r in sealed:
        if dest.startswith(r + "/"):
            raise PolicyError(f"{raw!r} lies inside {r}, which corral builds itself (the "
                              f"host's {r} stays hidden); mount something else", field=field)


def _paths(raw: Any, path: str) -> tuple[str, ...]:
    if not isinstance(raw, (list, tuple)):
        raise ValueError("expected a list of absolute paths")
    out = []
    for i, p in enumerate(raw):
        f = f"{path}[{i}]"
        if isinstance(p, str) and p.startswith("/") and "\0" not in p and ".." not in \
                p.split("/"):   # before whether it exists: /scratch need not, on the host
            check_mount_dest(os.path.normpath(p), f, p, sealed=(*_SEALED, "/workspace"))
        out.append(check_mount_source(p, f, "bound"))
    return tuple(out)


def _names(raw: Any, path: str) -> tuple[str, ...]:
    if not isinstance(raw, (list, tuple)):
        raise ValueError("expected a list of variable names")
    for i, n in enumerate(raw):
        if not _is_env_name(n):
            raise PolicyError(f"{n!r} is not a variable name (letters, digits, _)",
                              field=f"{path}[{i}]")
    return tuple(raw)


def _envset(raw: Any, path: str) -> tuple[tuple[str, str], ...]:
    if not isinstance(raw, dict):
        raise ValueError("expected a table of NAME = \"value\"")
    out = []
    for k, v in raw.items():
        if not _is_env_name(k):
            raise PolicyError(f"{k!r} is not a variable name (letters, digits, _)", field=path)
        if not isinstance(v, str) or "\0" in v:
            raise PolicyError("the value must be a string without NUL characters",
                              field=f"{path}.{k}")
        out.append((k, v))
    return tuple(out)


#: filesystem.workspace.mode: read-only, read-write, or writable with the writes kept in an
#: overlay until reviewed (runtime/changes.py)
WORKSPACE_MODES = ("ro", "rw", "review")


def _workspace(raw: Any, path: str) -> Workspace | None:
    if raw is None:
        return None
    if isinstance(raw, str):
        raw = {"path": raw}
    if not isinstance(raw, dict):
        raise ValueError("expected { path = \"/abs/dir\", mode = \"ro\" | \"rw\" | "
                         "\"review\" }")
    for k in raw:
        if k not in ("path", "mode", "mount_at"):
            raise PolicyError(_unknown(k, ("path", "mode", "mount_at")), field=f"{path}.{k}")
    if "path" not in raw:
        raise PolicyError("missing path; write { path = \"/abs/dir\" }", field=f"{path}.path")
    mount_at = raw.get("mount_at", WORKSPACE_AT)
    if mount_at not in (WORKSPACE_AT, "same"):
        raise PolicyError(f"{mount_at!r} is not a place; use \"{WORKSPACE_AT}\" (the "
                          f"default) or \"same\" (its host path)", field=f"{path}.mount_at")
    field = f"{path}.path"
    real = check_host_path(raw["path"], field)
    if not os.path.isdir(real):
        raise PolicyError(f"{raw['path']!r} is not a directory", field=field)
    real = check_mount_source(raw["path"], field, "a workspace")
    if mount_at == "same":
        check_mount_dest(real, field, raw["path"])
    mode = raw.get("mode", "ro")
    if mode not in WORKSPACE_MODES:
        raise PolicyError(f"{mode!r} is not a mode; use \"ro\" or \"rw\", or \"review\" "
                          f"(writable inside, the changes kept apart until applied)",
                          field=f"{path}.mode")
    return Workspace(path=real, mode=mode, mount_at=mount_at)


#: the longest requirement string taken (a name, extras, a version and a marker fit in a
#: few hundred characters); checked before the pattern runs
REQUIREMENT_MAX = 1024
#: NAME[extras] and a version tail, written so that a string matches one way only: the
#: name's characters are all the tail's too, so without extras the name is its first
#: character and the rest is tail. (NAME* then TAIL* backtracked quadratically on a long
#: name ended by a bad character: tests/unit/test_policy_hostile.py.)
_REQUIREMENT = (r"[A-Za-z0-9](?:[A-Za-z0-9._-]*\[[A-Za-z0-9._, -]*\])?"
                r"[ A-Za-z0-9<>=!~.,*;:'\"()_+-]*")


def _requirements(raw: Any, path: str) -> tuple[str, ...]:
    """Requirement strings (a name, extras, a version specifier, a marker): never a pip
    option, and nothing that would end the line pip reads."""
    import re

    if not isinstance(raw, (list, tuple)):
        raise ValueError("expected a list of requirement strings")
    for i, r in enumerate(raw):
        if isinstance(r, str) and len(r) > REQUIREMENT_MAX:
            raise PolicyError(f"{r[:40]!r}... is {len(r)} characters long; a requirement "
                              f"is at most {REQUIREMENT_MAX}", field=f"{path}[{i}]")
        if not isinstance(r, str) or not re.fullmatch(_REQUIREMENT, r):
            raise PolicyError(f"{r!r} is not a requirement (NAME[extras] and a version, "
                              "e.g. \"requests==2.32.3\"; no pip options, no URLs)",
                              field=f"{path}[{i}]")
    return tuple(raw)


def _urls(raw: Any, path: str) -> tuple[str, ...]:
    from urllib.parse import urlsplit

    if not isinstance(raw, (list, tuple)):
        raise ValueError("expected a list of http(s) URLs")
    for i, u in enumerate(raw):
        ok = False
        if isinstance(u, str) and not any(c in u for c in " \n\0"):
            try:
                parts = urlsplit(u)
                ok = parts.scheme in ("http", "https") and bool(parts.hostname) and (
                    parts.port is None or parts.port > 0)
            except ValueError:   # a port that is not a number
                ok = False
        if not ok:
            raise PolicyError(f"{u!r} is not an http(s) URL", field=f"{path}[{i}]")
    return tuple(raw)


_CONVERTERS = {
    "duration": lambda raw, path: parse_duration(raw),
    "size": lambda raw, path: parse_size(raw),
    "int": _int,
    "float": _float,
    "bool": lambda raw, path: _bool(raw),
    "tier": _tier,
    "netmode": _netmode,
    "paths": _paths,
    "names": _names,
    "envset": _envset,
    "workspace": _workspace,
    "file": _file,
    "image": _image,
    "rules": _strings,
    "cidrs": _strings,
    "nameservers": _strings,
    "requirements": _requirements,
    "urls": _urls,
}

