"""Generates docs/policy.md from the schema, so the reference cannot drift from the code.

    .venv/bin/python -m corral.policy.docs > docs/policy.md
"""

from __future__ import annotations

from .dump import dump_toml, format_value, get_value
from .schema import FIELDS, Policy

HEAD = """# Policy reference

A policy is one TOML file (`corral run --policy FILE`), a set of flags, or a dict passed
to the Python API; all three build the same policy. Flags override the file, key by key.
Unknown keys are errors, so a typo never silently means a default. A policy file is never
picked up from the workspace: a repository must not choose its own sandbox.

`corral policy show [--policy FILE] [flags]` prints the effective policy, every default
included, as TOML that `--policy` reads back.

## Units

- Durations: `"500ms"`, `"60s"`, `"2m"`, `"1h"`, or a bare number of seconds.
- Sizes: bytes (`4096`), or `K`, `M`, `G`, `T` with binary meaning: `"1M"` is 1 MiB
  (1048576 bytes). `"64KiB"` and `"512MB"` are read the same way.

## Keys

| key | default | range | what it does |
|---|---|---|---|
"""

TAIL = """
## What every sandbox gets, whatever the policy

On the namespace and gvisor tiers. The process tier has no namespaces and differs: a real
scratch directory is HOME and TMPDIR (there is no /scratch, /tmp or /workspace of its
own), the host's /proc is visible, Landlock hides the rest (docs/tiers.md).

- A read-only root: the host's `/usr`, `/bin`, `/sbin`, `/lib*`, and a minimal `/etc`
  (generated `passwd`, `group`, `hosts`, `hostname`, `nsswitch.conf`, an empty
  `resolv.conf`, plus the host's CA certificates, `alternatives`, `ld.so.cache` and a few
  other public files). Not the host's users, shadow file, SSH host keys or sudoers.
- `/scratch` (HOME and the working directory, unless a workspace is given), `/tmp` and
  `/dev/shm`: one tmpfs capped by `limits.scratch` and `limits.scratch_inodes`, kept across
  the commands of one `Sandbox`, deleted when it closes.
- A fresh `/proc`, a minimal `/dev` (null, zero, full, random, urandom, tty, pts, shm), no
  `/sys`, and none of the host's `/home`, `/root`, `/tmp`, `/run`, `/var`.
- The environment is `PATH`, `HOME=/scratch`, `LANG=C.UTF-8`, `TERM=dumb`, then `env.pass`,
  then `env.set`. Nothing else of the host's environment.
- stdin is `/dev/null` unless `corral run --stdin` passes a pipe or file through; the
  sandbox never gets the caller's terminal.

## The default policy, as `corral policy show` prints it

```toml
"""


def render() -> str:
    rows = []
    default = Policy()
    for spec in FIELDS:
        value = get_value(default, spec.path)
        shown = "none" if value is None else format_value(spec, value).replace("|", "\\|")
        rng = ""
        if spec.minimum is not None:
            lo = format_value(spec, spec.minimum)
            hi = format_value(spec, spec.maximum) if spec.maximum is not None else "-"
            rng = f"{lo} to {hi}"
        rows.append(f"| `{spec.path}` | `{shown}` | {rng} | {spec.doc} |")
    return HEAD + "\n".join(rows) + "\n" + TAIL + dump_toml(default) + "```\n"


if __name__ == "__main__":
    import sys

    sys.stdout.write(render())
