"""The catalogue: one module per case in this directory (docs/probe.md: the format).

Loading lists the directory, imports each module and checks its constants, so a case is
added by dropping a file here."""

from __future__ import annotations

import importlib
import os
from dataclasses import dataclass, field
from typing import Callable

CATEGORIES = {
    "resource": "resource exhaustion",
    "fs-secrets": "host secrets through the filesystem",
    "env-leak": "environment and credential leaks",
    "network": "network egress and proxy bypass",
    "dns": "DNS exfiltration",
    "kernel": "kernel attack surface",
    "escape": "namespace escape",
    "supply-chain": "supply chain at install time",
    "persistence": "persistence across runs",
    "info": "host information disclosure",
    "dos": "denial of service against the supervisor and proxy",
    "terminal": "terminal injection",
}

CONTROL_KINDS = ("host", "policy", "code")


@dataclass
class Case:
    id: str
    category: str
    description: str
    claims: tuple
    code: str
    control: object          # "host" | {"policy": {...}} | {"code": "...", "where": ...}
    contained: str
    policy: dict = field(default_factory=dict)
    safety: tuple = ()
    second: str | None = None        # a second run in a fresh sandbox (persistence)
    score: Callable | None = None    # score(obs) -> (contained: bool | None, reason)
    tty: bool = False                # run `corral run` (not --json) with a terminal as output
    nohup: bool = False              # its caller ignores SIGINT/SIGHUP, blocks SIGUSR1/2
    refused_by: str | None = None    # contained when corral refuses the policy: this field
    install: dict | None = None      # through the install phase (probe/install_phase.py)
    module: str = ""


def _check(mod, name: str) -> Case:
    for attr in ("ID", "CATEGORY", "DESCRIPTION", "CLAIMS", "CODE", "CONTROL", "CONTAINED"):
        if not hasattr(mod, attr):
            raise ValueError(f"probe case {name}: missing {attr}")
    if mod.CATEGORY not in CATEGORIES:
        raise ValueError(f"probe case {name}: unknown category {mod.CATEGORY!r}")
    ctl = mod.CONTROL
    kind = ctl if isinstance(ctl, str) else (
        ("code" if "code" in ctl else "policy" if "policy" in ctl else None)
        if isinstance(ctl, dict) else None)
    if kind not in CONTROL_KINDS:
        raise ValueError(f"probe case {name}: CONTROL must be \"host\", {{\"policy\": ...}} "
                         f"or {{\"code\": ...}}")
    return Case(id=mod.ID, category=mod.CATEGORY, description=mod.DESCRIPTION,
                claims=tuple(mod.CLAIMS), code=mod.CODE, control=ctl,
                contained=mod.CONTAINED, policy=dict(getattr(mod, "POLICY", {})),
                safety=tuple(getattr(mod, "SAFETY", ())), second=getattr(mod, "SECOND", None),
                score=getattr(mod, "score", None), tty=bool(getattr(mod, "TTY", False)),
                nohup=bool(getattr(mod, "NOHUP", False)),
                refused_by=getattr(mod, "REFUSED_BY", None),
                install=getattr(mod, "INSTALL", None), module=name)


def load_cases() -> list[Case]:
    here = os.path.dirname(os.path.abspath(__file__))
    cases, seen = [], set()
    for fn in sorted(os.listdir(here)):
        if not fn.endswith(".py") or fn.startswith("_"):
            continue
        name = fn[:-3]
        case = _check(importlib.import_module(f"{__name__}.{name}"), name)
        if case.id in seen:
            raise ValueError(f"probe case {name}: duplicate id {case.id}")
        seen.add(case.id)
        cases.append(case)
    order = list(CATEGORIES)
    cases.sort(key=lambda c: (order.index(c.category), c.id))
    return cases
