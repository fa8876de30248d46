"""Printing a Policy back as TOML that `--policy` reads again, every default included."""

from __future__ import annotations

try:     # the C encoder json.dumps(ensure_ascii=False) uses, without json's import (re, enum):
    from _json import encode_basestring as _quote  # the audit writer dumps on exit's path
except ImportError:   # pragma: no cover
    from json.encoder import py_encode_basestring as _quote

from .schema import FIELDS, SECTIONS, Policy, Spec, Workspace
from .units import format_duration, format_size


def _s(text: str) -> str:
    # JSON's string escapes are a subset of TOML's basic-string escapes; JSON leaves DEL
    # as it is, which TOML refuses in a string (tests/fuzz/test_fuzz_policy.py found it)
    return _quote(text).replace("\x7f", "\\u007f")


def format_value(spec: Spec, value) -> str:
    if spec.kind == "duration":
        return _s(format_duration(value))
    if spec.kind == "size":
        return _s(format_size(int(value)))
    if spec.kind == "int":
        return str(int(value))
    if spec.kind == "float":
        return repr(float(value))
    if spec.kind == "bool":
        return "true" if value else "false"
    if spec.kind in ("tier", "netmode"):
        return _s(value)
    if spec.kind in ("paths", "names", "rules", "cidrs", "nameservers", "requirements", "urls"):
        return "[" + ", ".join(_s(v) for v in value) + "]"
    if spec.kind == "envset":
        return "{ " + ", ".join(f"{k} = {_s(v)}" for k, v in value) + " }" if value else "{}"
    if spec.kind in ("file", "image"):
        return _s(value)
    if spec.kind == "workspace":
        return (f"{{ path = {_s(value.path)}, mode = {_s(value.mode)}, "
                f"mount_at = {_s(value.mount_at)} }}")
    raise AssertionError(spec.kind)


def get_value(policy: Policy, path: str):
    obj = policy
    for part in path.split("."):
        obj = getattr(obj, "pass_" if part == "pass" else part)
    return obj


def dump_toml(policy: Policy) -> str:
    return _dump(lambda path: get_value(policy, path), policy.image,
                 [(s.name, s.source, s.hosts, s.ttl, s.plain_http) for s in policy.secrets])


_DEFAULT_TOML: list[str] = []


def dump_form(form: dict) -> str:
    """The TOML of a policy in the form audit/record.py `policy_form` writes: {} for the
    default policy, else its field values and secrets (JSON-decoded)."""
    if not form:
        if not _DEFAULT_TOML:
            _DEFAULT_TOML.append(dump_toml(Policy()))
        return _DEFAULT_TOML[0]
    values, secrets = form["values"], form["secrets"]
    kinds = {spec.path: spec.kind for spec in FIELDS}

    def value(path: str):
        v = values[path]
        if v is not None and kinds[path] == "workspace":
            path_, mode, mount_at = v
            return Workspace(path_, mode, mount_at)
        return v

    return _dump(value, values["image"], [tuple(s) for s in secrets])


def _dump(get, image, secrets) -> str:
    lines = [f"isolation = {format_value(FIELDS[0], get('isolation'))}",
             f"image = {_s(image)}"]
    tables = [s for s in SECTIONS]
    for spec in FIELDS:
        table = spec.path.rsplit(".", 1)[0]
        if "." in table and table not in tables:
            tables.append(table)
    for table in tables:
        lines += ["", f"[{table}]"]
        for spec in FIELDS:
            if spec.path.rsplit(".", 1)[0] != table:
                continue
            key = spec.path.rsplit(".", 1)[1]
            value = get(spec.path)
            if value is None:
                lines.append(f"# {key}: none (the default)")
            else:
                lines.append(f"{key} = {format_value(spec, value)}")
    for name, source, hosts, ttl, plain_http in secrets:
        lines += ["", f"[secrets.{name}]"]
        if source == "literal":
            lines.append("# from: a literal value given through the Python API (not shown)")
        else:
            lines.append(f"from = {_s(source)}")
        lines += [f"hosts = [{', '.join(_s(h) for h in hosts)}]",
                  f"ttl = {_s(format_duration(ttl))}",
                  f"plain_http = {'true' if plain_http else 'false'}"]
    return "\n".join(lines) + "\n"
