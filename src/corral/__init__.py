"""corral: a self-hosted sandbox for the code that AI assistants write."""

__version__ = "0.1.0"
