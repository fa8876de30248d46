"""What of the supervisor's environment an egress proxy (and the zygote) sees:
backends/host/launch.proxy_env passes PATH and the relay's two bench knobs, nothing else
(a caller's tokens, HOME, proxies of its own never reach the process that talks to the
network for the sandbox)."""

from corral.backends.host.launch import PROXY_ENV_PASSED, proxy_env


def test_only_path_without_the_knobs(monkeypatch):
    for k in PROXY_ENV_PASSED:
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("GITHUB_TOKEN", "ghp_secret")
    monkeypatch.setenv("HTTPS_PROXY", "http://elsewhere:3128")
    assert proxy_env() == {"PATH": "/usr/bin:/bin"}


def test_the_relay_knobs_are_passed_on(monkeypatch):
    monkeypatch.setenv("CORRAL_EGRESS_RELAY_SPLICE", "1")
    monkeypatch.setenv("CORRAL_EGRESS_RELAY_THREADS", "0")
    monkeypatch.setenv("CORRAL_EGRESS_SOMETHING_ELSE", "x")
    monkeypatch.setenv("HOME", "/root")
    assert proxy_env() == {"PATH": "/usr/bin:/bin", "CORRAL_EGRESS_RELAY_SPLICE": "1",
                           "CORRAL_EGRESS_RELAY_THREADS": "0"}


def test_the_knobs_are_the_relays():
    # the names relay.py reads: a rename there without one here would silently stop the A/B
    import inspect

    from corral.egress import relay

    src = inspect.getsource(relay)
    for k in PROXY_ENV_PASSED:
        assert f'"{k}"' in src, k
