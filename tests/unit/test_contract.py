"""The tier contract (backends/base.py) and the registry: every tier is a Backend, the
registry is the one list of tiers, and the fake tier is reachable only from code."""

import subprocess

import pytest
from conftest import CORRAL

import corral
from corral.backends import AUTO_ORDER, KNOWN, REGISTRY, get_backend
from corral.backends.base import Backend, LiveSandbox
from corral.backends.fake import FakeBackend
from corral.errors import BackendUnavailable, PolicyError
from corral.policy import policy_from_dict
from corral.result import Result


def test_the_registry_is_the_one_list_of_tiers():
    assert KNOWN == ("namespace", "gvisor", "process", "microvm", "wasm")
    # microvm and wasm are used when asked for by name, never by auto
    assert AUTO_ORDER == ("gvisor", "namespace", "process")
    assert len({t.name for t in REGISTRY}) == len(REGISTRY)


def test_the_names_a_policy_accepts_are_the_registrys_public_tiers():
    """policy/ is a pure leaf and cannot read the registry: its list of tier names must be
    the registry's public rows (plus "auto"), and the fake tier in neither."""
    from corral.policy import TIERS

    assert set(TIERS) == {*KNOWN, "auto"} and "fake" not in TIERS


@pytest.mark.parametrize("row", [t for t in REGISTRY if t.target], ids=lambda t: t.name)
def test_every_tier_is_a_backend_on_the_contract(row):
    module, _, cls = row.target.partition(":")
    backend_cls = getattr(__import__(f"corral.backends.{module}", fromlist=[cls]), cls)
    assert issubclass(backend_cls, Backend)
    assert backend_cls.name == row.name
    assert backend_cls.own_kernel in (False, "user-space", True)
    assert isinstance(backend_cls.mechanism, str) and backend_cls.mechanism
    assert isinstance(get_backend(row.name).properties, dict)
    # every method the runtime calls is the tier's own, not the contract's placeholder
    for method in ("check", "describe", "open"):
        assert getattr(backend_cls, method) is not getattr(Backend, method), method


@pytest.mark.parametrize("tier", ["nosuch"])
def test_a_tier_without_a_module_is_unavailable(tier):
    with pytest.raises(BackendUnavailable, match="not available in this release"):
        get_backend(tier)


def test_the_fake_tier_runs_from_code_with_scripted_results():
    seen = []

    def handler(argv, stdin):
        seen.append((argv, stdin))
        return Result(verdict="error", exit_code=3, signal=None, stdout="out\n",
                      isolation="fake")

    fake = FakeBackend(handler)
    chunks = []
    with corral.Sandbox({"limits": {"timeout": "5s"}}, backend=fake) as sb:
        assert sb.isolation == "fake"
        r = sb.exec(["echo", "hi"], stdin=b"in", on_stdout=chunks.append)
    assert (r.verdict, r.exit_code, r.stdout) == ("error", 3, "out\n")
    assert seen == [(["echo", "hi"], b"in")] and chunks == [b"out\n"]
    (live,) = fake.opened
    assert isinstance(live, LiveSandbox) and live.closed


def test_no_policy_can_name_the_fake_tier():
    with pytest.raises(PolicyError, match="isolation"):
        policy_from_dict({"isolation": "fake"})
    r = subprocess.run([CORRAL, "run", "--isolation", "fake", "--", "/bin/true"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "fake" in r.stderr and "isolation" in r.stderr, r


def test_close_time_problems_are_kept_on_the_sandbox_and_the_last_result():
    fake = FakeBackend(close_problems=("umount /x: busy",))
    with corral.Sandbox(None, backend=fake) as sb:
        first = sb.exec(["a"])
        last = sb.exec(["b"])
    assert sb.teardown_problems == ["umount /x: busy"]
    assert last.events[-1] == {"kind": "teardown", "message": "umount /x: busy"}
    assert not [e for e in first.events if e["kind"] == "teardown"]
    assert sb.close() == []          # closed once: nothing more to report


def test_run_returns_the_teardown_problems_in_its_result():
    from corral.runtime import sandbox

    real = sandbox.Sandbox

    class WithFake(real):
        def __init__(self, policy=None, **kw):
            super().__init__(policy, backend=FakeBackend(close_problems=("rm scratch: EBUSY",)))

    sandbox.Sandbox = WithFake
    try:
        r = sandbox.run(["x"])
    finally:
        sandbox.Sandbox = real
    assert {"kind": "teardown", "message": "rm scratch: EBUSY"} in r.events


# -- check() -> TierCheck -> open(plan, check) ---------------------------------------------

def _plan(data):
    from corral.plan import build_plan

    return build_plan(policy_from_dict(data), {})


def test_plan_find_is_isinstance_for_every_class_in_order():
    import abc

    import corral.plan as plan_mod
    from corral._record import Record

    plan = _plan({"limits": {"memory": "256M"}, "network": {"mode": "allow",
                                                            "allow": ["example.com"]}})
    classes = [c for c in vars(plan_mod).values() if isinstance(c, type)]

    class Virtual(abc.ABC):  # noqa: B024 (registered classes only)
        pass

    Virtual.register(plan_mod.Scratch)   # isinstance() says yes; no __mro__ names it
    for cls in [*classes, Record, object, Virtual, (plan_mod.Scratch, plan_mod.Seccomp)]:
        want = [op for op in plan.ops if isinstance(op, cls)]
        assert plan.find(cls) == want and plan.find(cls) is not plan.find(cls), cls
    assert plan.find(Virtual) == plan.find(plan_mod.Scratch) != []


def test_a_tier_check_splits_refusals_from_defaults_by_what_the_policy_set():
    from corral.backends.base import TierCheck
    from corral.plan import MemoryLimit, Namespaces, PidsLimit, Scratch

    plan = _plan({"limits": {"memory": "256M"}})
    (mem,), (pids,), (scratch,), (ns,) = (plan.find(t) for t in (MemoryLimit, PidsLimit,
                                                                 Scratch, Namespaces))
    check = TierCheck.of("fake", plan, [(mem, "no memory cgroup"), (scratch, "no tmpfs"),
                                        (ns, "no namespaces")])
    assert [(g.rule, g.explicit) for g in check.gaps] == [
        ("limits.memory", True), ("limits.scratch", False), ("Namespaces", False)]
    assert [g.op for g in check.refused] == [mem]
    assert [g.op for g in check.unenforced] == [scratch, ns]
    assert not check.enforces(mem) and not check.enforces(scratch) and check.enforces(pids)
    assert check.gap(scratch).reason == "no tmpfs" and check.gap(pids) is None
    # the events are today's dicts, key for key and in order: the Result JSON is unchanged
    assert [list(e.items()) for e in check.events()] == [
        [("kind", "unenforced"), ("rule", "limits.scratch"), ("tier", "fake"),
         ("reason", "no tmpfs")],
        [("kind", "unenforced"), ("rule", "Namespaces"), ("tier", "fake"),
         ("reason", "no namespaces")]]
    assert check.events() is not check.events()      # fresh dicts for every Result


def test_open_takes_only_its_own_tiers_check_with_nothing_refused():
    from corral.backends.base import TierCheck
    from corral.plan import MemoryLimit

    plan = _plan({"limits": {"memory": "256M"}})
    fake = FakeBackend()
    fake.open(plan, fake.check(plan)).close()
    with pytest.raises(AssertionError, match="own check"):
        fake.open(plan, TierCheck.of("namespace", plan, []))
    (mem,) = plan.find(MemoryLimit)
    with pytest.raises(AssertionError, match="nothing refused"):
        fake.open(plan, TierCheck.of("fake", plan, [(mem, "no memory cgroup")]))
    assert fake.opened[1:] == []


class _Gappy(FakeBackend):
    """A tier that cannot enforce the memory limit here: the runtime must refuse a policy
    that sets one, and run the default with an "unenforced" event in every Result."""

    def check(self, plan):
        from corral.backends.base import TierCheck
        from corral.plan import MemoryLimit

        return TierCheck.of(self.name, plan, [(op, "no usable memory cgroup: test")
                                              for op in plan.find(MemoryLimit)])


def test_the_runtime_runs_a_default_unenforced_and_says_so_in_each_result():
    with corral.Sandbox(None, backend=_Gappy()) as sb:
        results = [sb.exec(["a"]), sb.exec(["b"])]
    for r in results:
        assert r.events == [{"kind": "unenforced", "rule": "limits.memory", "tier": "fake",
                             "reason": "no usable memory cgroup: test"}]
    assert results[0].events is not results[1].events


def test_the_runtime_refuses_an_explicit_rule_the_tier_cannot_enforce():
    from corral.errors import UnsupportedRule

    gappy = _Gappy()
    with pytest.raises(UnsupportedRule) as e:
        corral.Sandbox({"limits": {"memory": "256M"}}, backend=gappy)
    assert e.value.field == "limits.memory" and "no usable memory cgroup" in e.value.message
    assert gappy.opened == []      # nothing was opened
