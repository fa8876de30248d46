"""A token's --max-lifetime through the E2B face, with the official SDK against a real
`corral serve` (e2bfix): create with a longer timeout is refused, and so are set_timeout
and connect past the lifetime counted from the sandbox's creation; within it they work."""

import pytest
from conftest import tier_unavailable
from e2bfix import e2b_env, e2b_serve

e2b = pytest.importorskip("e2b")
from e2b import Sandbox  # noqa: E402
from e2b.exceptions import SandboxException  # noqa: E402

pytestmark = pytest.mark.skipif(tier_unavailable("namespace") is not None,
                                reason=f"namespace tier: {tier_unavailable('namespace')}")


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    s = e2b_serve(tmp_path_factory.mktemp("e2b-life"), {"brief": ["--max-lifetime", "2m"]},
                  "[base]\n\n")
    yield s
    s.stop()


@pytest.fixture
def env(server, monkeypatch):
    return e2b_env(server, monkeypatch, token="brief")


def test_the_max_lifetime_holds_through_the_e2b_face(env):
    with pytest.raises(SandboxException, match="lifetime"):
        Sandbox.create(timeout=3600)
    assert Sandbox.list().next_items() == []
    with Sandbox.create(timeout=60) as sb:
        with pytest.raises(SandboxException, match="lifetime"):
            sb.set_timeout(3600)
        with pytest.raises(SandboxException, match="lifetime"):
            Sandbox.connect(sb.sandbox_id, timeout=3600)
        sb.set_timeout(90)
        assert sb.commands.run("echo ok").stdout == "ok\n"


def test_the_lifetime_counts_from_the_sandboxs_own_creation(env):
    """The instant the bound counts from (E2B's startedAt) is the sandbox's own creation,
    where its timeout began (the REST view's `created`, its get_info()), not the later
    moment the service filed it."""
    with Sandbox.create(timeout=60) as sb:
        started = Sandbox.get_info(sb.sandbox_id).started_at.timestamp()
        with env.http(env.tokens["brief"]) as http:
            created = http.get(f"/sandboxes/{sb.sandbox_id}").json()["created"]
        assert abs(started - created) < 1e-6, (started, created)
