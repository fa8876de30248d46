"""What run_code returns, in the shape of E2B's Execution: results (each display format an
attribute), logs, error, execution_count. Plain data (runtime/session.py fills it)."""

from __future__ import annotations

import json

#: Jupyter mime type -> the Result attribute (E2B's names)
MIME_ATTRS = {
    "text/plain": "text", "text/html": "html", "text/markdown": "markdown",
    "image/svg+xml": "svg", "image/png": "png", "image/jpeg": "jpeg",
    "application/pdf": "pdf", "text/latex": "latex", "application/json": "json",
    "application/javascript": "javascript",
}
BASE64_MIMES = ("image/png", "image/jpeg", "application/pdf")


# --- what run_code returns (the shape of E2B's Execution) ---------------------------------

class CodeResult:
    """One display result: the last expression's value (is_main_result) or a display()/
    figure. Each format is an attribute (None when absent): text, html, markdown, svg,
    png (base64), jpeg (base64), pdf (base64), latex, json, javascript; `extra` holds any
    other mime type the interpreter sent, as str."""

    __slots__ = (
        "extra",
        "html",
        "is_main_result",
        "javascript",
        "jpeg",
        "json",
        "latex",
        "markdown",
        "pdf",
        "png",
        "svg",
        "text",
    )

    def __init__(self, data: dict, is_main_result: bool = False) -> None:
        for attr in MIME_ATTRS.values():
            setattr(self, attr, None)
        self.extra = {}
        for mime, value in data.items():
            attr = MIME_ATTRS.get(mime)
            if attr is None:
                self.extra[mime] = value
            else:
                setattr(self, attr, value)
        self.is_main_result = is_main_result

    def formats(self) -> list[str]:
        """The formats present besides text (E2B's Result.formats())."""
        out = [a for a in MIME_ATTRS.values() if a != "text" and getattr(self, a) is not None]
        return out + list(self.extra)

    def to_dict(self) -> dict:
        d = {a: getattr(self, a) for a in MIME_ATTRS.values() if getattr(self, a) is not None}
        if self.extra:
            d["extra"] = dict(self.extra)
        d["is_main_result"] = self.is_main_result
        return d

    def __repr__(self) -> str:
        return f"CodeResult(formats={['text', *self.formats()]}, main={self.is_main_result})"


class Logs:
    """The cell's output as the chunks it came in (lists of str)."""

    __slots__ = ("stderr", "stdout")

    def __init__(self) -> None:
        self.stdout: list[str] = []
        self.stderr: list[str] = []

    def to_dict(self) -> dict:
        return {"stdout": list(self.stdout), "stderr": list(self.stderr)}

    def __repr__(self) -> str:
        return f"Logs(stdout={self.stdout!r}, stderr={self.stderr!r})"


class ExecutionError:
    """The cell's exception: name ("ZeroDivisionError"), value (its message) and traceback
    (one str, as E2B gives it; `traceback_lines` is the list the interpreter sent).
    corral's own: "TimeoutError" (interrupted at the timeout), "ContextDied" (the
    interpreter exited, was killed or broke the protocol; the message says which)."""

    __slots__ = ("name", "traceback_lines", "value")

    def __init__(self, name: str, value: str, traceback: list[str] | None = None) -> None:
        self.name, self.value = name, value
        self.traceback_lines = list(traceback or [])

    @property
    def traceback(self) -> str:
        return "".join(self.traceback_lines)

    def to_dict(self) -> dict:
        return {"name": self.name, "value": self.value, "traceback": self.traceback}

    def __repr__(self) -> str:
        return f"ExecutionError({self.name!r}, {self.value!r})"


class Execution:
    """What one run_code call produced: results, logs, error, execution_count.

    `exit_code` is the bash cell's exit status (None for python and javascript); the
    *_truncated flags say the logs or results hit their caps (what came later was dropped
    here, though the callbacks saw all of it)."""

    def __init__(self) -> None:
        self.results: list[CodeResult] = []
        self.logs = Logs()
        self.error: ExecutionError | None = None
        self.execution_count: int | None = None
        self.exit_code: int | None = None
        self.stdout_truncated = self.stderr_truncated = self.results_truncated = False

    @property
    def text(self) -> str | None:
        """The main result's text/plain (E2B's Execution.text)."""
        for r in self.results:
            if r.is_main_result:
                return r.text
        return None

    def to_dict(self) -> dict:
        return {"results": [r.to_dict() for r in self.results], "logs": self.logs.to_dict(),
                "error": self.error.to_dict() if self.error else None,
                "execution_count": self.execution_count}

    def to_json(self, **kw) -> str:
        return json.dumps(self.to_dict(), **kw)

    def __repr__(self) -> str:
        return (f"Execution(results={self.results!r}, logs={self.logs.to_dict()!r}, "
                f"error={self.error!r}, execution_count={self.execution_count})")
