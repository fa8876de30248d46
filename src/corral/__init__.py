"""corral: a self-hosted sandbox for the code that AI assistants write.

    import corral
    r = corral.run(["python3", "-c", "print(1)"], policy={"limits": {"timeout": "5s"}})
    r.verdict, r.exit_code, r.stdout
"""

from .errors import (
                     BackendUnavailable,
                     CorralError,
                     PolicyError,
                     SandboxClosed,
                     SandboxSetupError,
                     UnsupportedRule,
                     UsageError,
)
from .policy import Policy
from .result import Result, Usage
from .runtime.sandbox import Sandbox, TextChunks, run

__version__ = "0.1.0"


def __getattr__(name: str):
    # imported on first use: live sandboxes are not on `corral run`'s start-up path
    if name == "Pool":
        from .runtime.pool import Pool

        return Pool
    if name == "batch":         # corral.batch.map: batch runs (scale/), loaded when used
        import importlib

        return importlib.import_module(".batch", __name__)
    if name == "load_policy":   # policy.load is imported when a policy is read
        from .policy import load_policy

        return load_policy
    raise AttributeError(f"module 'corral' has no attribute {name!r}")

__all__ = ["BackendUnavailable", "CorralError", "Policy", "PolicyError", "Pool", "Result",
           "SandboxClosed", "SandboxSetupError", "Sandbox", "TextChunks", "UnsupportedRule", "UsageError", "Usage",
           "load_policy", "run", "__version__"]
