"""A token's ceiling (corral.service.ceiling): a table of requests each ceiling admits or
refuses, naming the rule. Pure: two Policy objects, no sandbox."""

import os

import pytest
from conftest import ROOT

from corral.errors import PolicyError
from corral.policy.load import policy_from_dict
from corral.service.ceiling import Exceeds, check, narrow, requested

WS = os.path.join(ROOT, "src")          # a real directory, as a workspace must be
NET = {"mode": "allow", "allow": ["*.example.com", "api.github.com:443"],
       "allow_private": ["10.1.0.0/16"], "deny": ["bad.example.com"]}
WIDE = {
    "isolation": "namespace",
    "limits": {"memory": "1G", "timeout": "5m"},
    "network": NET,
    "secrets": {"TOKEN": {"from": "env:GH", "hosts": ["api.github.com"], "ttl": "10m"}},
    "filesystem": {"workspace": {"path": WS, "mode": "review"},
                   "ro_binds": ["/usr/share"]},
    "env": {"pass": ["LANG"]},
}

# (ceiling, request, None if admitted else the field named)
CASES = [
    # isolation: weaker tier refused, stronger admitted
    ({}, {}, None),
    ({}, {"isolation": "process"}, "isolation"),
    ({}, {"isolation": "auto"}, "isolation"),
    ({}, {"isolation": "gvisor"}, None),
    ({"isolation": "gvisor"}, {"isolation": "namespace"}, "isolation"),
    ({"isolation": "process"}, {"isolation": "namespace"}, None),
    # microvm (its own kernel) and wasm (a WASI runtime in a namespace sandbox) are ranked
    # too: a ceiling of either admits its own tier (it refused every request, its own
    # included), and neither admits a weaker one
    ({"isolation": "microvm"}, {}, None),
    ({"isolation": "microvm"}, {"isolation": "gvisor"}, "isolation"),
    ({"isolation": "microvm"}, {"isolation": "namespace"}, "isolation"),
    ({"isolation": "wasm"}, {}, None),
    ({"isolation": "wasm"}, {"isolation": "namespace"}, "isolation"),
    ({"isolation": "wasm"}, {"isolation": "auto"}, "isolation"),
    ({}, {"isolation": "microvm"}, None),
    ({}, {"isolation": "wasm"}, None),
    ({"isolation": "gvisor"}, {"isolation": "microvm"}, None),
    ({"isolation": "auto"}, {"isolation": "process"}, None),
    # limits: bigger refused, equal or smaller admitted
    ({}, {"limits": {"memory": "2G"}}, "limits.memory"),
    ({}, {"limits": {"memory": "128M"}}, None),
    ({}, {"limits": {"timeout": "1h"}}, "limits.timeout"),
    ({}, {"limits": {"pids": 100000}}, "limits.pids"),
    (WIDE, {"limits": {"memory": "1G"}}, None),
    # idle_timeout: 0 is "never", the loosest (it was taken for the smallest)
    ({"limits": {"idle_timeout": "10m"}}, {}, None),
    ({"limits": {"idle_timeout": "10m"}}, {"limits": {"idle_timeout": "5m"}}, None),
    ({"limits": {"idle_timeout": "10m"}}, {"limits": {"idle_timeout": "0s"}},
     "limits.idle_timeout"),
    ({"limits": {"idle_timeout": "10m"}}, {"limits": {"idle_timeout": "1h"}},
     "limits.idle_timeout"),
    ({}, {"limits": {"idle_timeout": "1h"}}, None),      # the default ceiling: never
    # network: a mode, a domain, a port, a private range, a resolver the ceiling lacks
    ({}, {"network": {"mode": "allow", "allow": ["example.com"]}}, "network.mode"),
    (WIDE, {"network": {"mode": "allow", "allow": ["a.example.com"]}}, None),
    (WIDE, {"network": {"mode": "allow", "allow": ["*.b.example.com"]}}, None),
    (WIDE, {"network": {"mode": "allow", "allow": ["*.example.com"]}}, None),
    (WIDE, {"network": {"mode": "allow", "allow": ["example.com"]}}, "network.allow"),
    (WIDE, {"network": {"mode": "allow", "allow": ["evil.com"]}}, "network.allow"),
    (WIDE, {"network": {"mode": "allow", "allow": ["a.example.com:22"]}}, "network.allow"),
    (WIDE, {"network": {"mode": "allow", "allow": ["api.github.com"]}}, "network.allow"),
    (WIDE, {"network": {"mode": "allow", "allow": ["api.github.com:443"]}}, None),
    (WIDE, {"network": {"mode": "allow", "allow": ["10.1.2.3"]}}, "network.allow"),
    (WIDE, {"network": {"mode": "allow", "allow_private": ["10.1.2.0/24"]}}, None),
    (WIDE, {"network": {"mode": "allow", "allow_private": ["10.0.0.0/8"]}},
     "network.allow_private"),
    (WIDE, {"network": {"mode": "allow", "allow_private": ["192.168.0.0/16"]}},
     "network.allow_private"),
    (WIDE, {"network": {"mode": "allow", "nameservers": ["9.9.9.9"]}}, "network.nameservers"),
    (WIDE, {"network": {"mode": "allow", "budget": {"requests": 5000}}},
     "network.budget.requests"),
    # secrets: a name, a host, a ttl the ceiling does not grant
    ({}, {"secrets": {"TOKEN": {"hosts": ["api.github.com"]}}}, "secrets.TOKEN"),
    (WIDE, {"network": NET, "secrets": {"TOKEN": {"hosts": ["api.github.com"], "ttl": "5m"}}},
     None),
    (WIDE, {"network": NET, "secrets": {"TOKEN": {"hosts": ["x.example.com"], "ttl": "5m"}}},
     "secrets.TOKEN.hosts"),
    (WIDE, {"network": NET, "secrets": {"TOKEN": {"hosts": ["api.github.com"], "ttl": "1h"}}},
     "secrets.TOKEN.ttl"),
    (WIDE, {"network": NET, "secrets": {"OTHER": {"hosts": ["api.github.com"]}}},
     "secrets.OTHER"),
    # workspace: none, another path, a looser mode
    ({}, {"filesystem": {"workspace": {"path": WS}}}, "filesystem.workspace"),
    (WIDE, {"filesystem": {"workspace": {"path": WS + "/corral", "mode": "ro"}}}, None),
    (WIDE, {"filesystem": {"workspace": {"path": WS, "mode": "review"}}}, None),
    (WIDE, {"filesystem": {"workspace": {"path": WS, "mode": "rw"}}},
     "filesystem.workspace.mode"),
    (WIDE, {"filesystem": {"workspace": {"path": os.path.join(ROOT, "docs")}}}, "filesystem.workspace.path"),
    (WIDE, {"filesystem": {"workspace": {"path": ROOT}}}, "filesystem.workspace.path"),
    (WIDE, {"filesystem": {"ro_binds": ["/usr/share/doc"]}}, None),
    (WIDE, {"filesystem": {"ro_binds": ["/usr/lib"]}}, "filesystem.ro_binds"),
    # host variables
    ({}, {"env": {"pass": ["HOME"]}}, "env.pass"),
    (WIDE, {"env": {"pass": ["LANG"]}}, None),
    (WIDE, {"env": {"set": {"FOO": "bar"}}}, None),
]


def _policy(d):
    return policy_from_dict(d, allow_literal=False)


@pytest.mark.parametrize("ceiling,request_,field", CASES,
                         ids=[f"{i}-{c[2] or 'ok'}" for i, c in enumerate(CASES)])
def test_ceiling_table(ceiling, request_, field):
    """Each request through the service's own path (requested: the ceiling's limits where
    left out, secret sources from the ceiling), then the pure check."""
    if field is None:
        requested(request_, ceiling)
        return
    with pytest.raises(Exceeds) as e:
        requested(request_, ceiling)
    assert e.value.field == field, e.value.message


def test_check_itself_is_pure_over_two_policies():
    assert check(_policy({}), _policy({})) is None
    with pytest.raises(Exceeds) as e:
        check(_policy({"limits": {"cpus": 4}}), _policy({}))
    assert e.value.field == "limits.cpus"


def test_requested_takes_the_ceilings_limits_and_fills_secret_sources():
    ceiling = {"limits": {"memory": "256M"}, "network": NET,
               "secrets": {"TOKEN": {"from": "env:GH", "hosts": ["api.github.com"]}}}
    p = requested({"network": NET, "secrets": {"TOKEN": {"hosts": ["api.github.com"]}}},
                  ceiling)
    assert p.limits.memory == 256 << 20       # left out: the ceiling's, not the default 512M
    assert p.secrets[0].source == "env:GH"    # the server's source, never the client's
    assert "bad.example.com" in p.network.deny


@pytest.mark.parametrize("table", [{"from": "env:HOME", "hosts": ["api.github.com"]},
                                   {"value": "s3cret", "hosts": ["api.github.com"]}])
def test_a_request_cannot_name_a_secret_source_or_value(table):
    ceiling = {"network": NET,
               "secrets": {"TOKEN": {"from": "env:GH", "hosts": ["api.github.com"]}}}
    with pytest.raises(PolicyError) as e:
        requested({"network": NET, "secrets": {"TOKEN": table}}, ceiling)
    assert e.value.field == "secrets.TOKEN"


def test_narrow_adds_the_ceilings_deny_rules():
    p = narrow(_policy({"network": {"mode": "allow", "allow": ["a.example.com"]}}),
               _policy({"network": NET}))
    assert p.network.deny == ("bad.example.com",)
