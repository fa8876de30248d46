"""corral's public face is exactly this list: nothing private leaks into it by accident,
and nothing public disappears without this test changing (as httpx's test does)."""

import corral


def test_the_public_names():
    assert sorted(corral.__all__) == sorted([
        "BackendUnavailable", "CorralError", "Policy", "PolicyError", "Pool", "Result",
        "SandboxClosed", "SandboxSetupError", "Sandbox", "TextChunks", "UnsupportedRule", "UsageError", "Usage",
        "load_policy", "run", "__version__"])


def test_every_public_name_is_defined_and_documented():
    for name in corral.__all__:
        value = getattr(corral, name)
        if name != "__version__":
            assert value.__doc__, f"corral.{name} has no docstring"
