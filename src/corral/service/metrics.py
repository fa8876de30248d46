"""The service's counters, in Prometheus text format (GET /metrics)."""

from __future__ import annotations

import threading


class Metrics:
    BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)

    def __init__(self) -> None:
        self.mu = threading.Lock()
        self.created = 0
        self.runs: dict[str, int] = {}
        self.requests: dict[int, int] = {}
        self.hist = [0] * (len(self.BUCKETS) + 1)
        self.hist_sum = 0.0
        #: events of runs that say something was refused, by kind (net, secret, limit,
        #: syscall, refused): the rule as the audit store's denials (audit/query.py)
        self.denials: dict[str, int] = {}
        #: POST .../exec requests answered by the lean path (fastexec.py), not FastAPI
        self.lean = 0
        #: of those, foreground commands started and watched by the event loop itself
        #: (no thread: service/commands.py CommandTable.start's `loop`)
        self.lean_loop = 0

    def run(self, verdict: str, seconds: float, events=()) -> None:
        with self.mu:
            self.runs[verdict] = self.runs.get(verdict, 0) + 1
            for ev in events:
                kind = denial_kind(ev)
                if kind is not None:
                    self.denials[kind] = self.denials.get(kind, 0) + 1
            i = next((i for i, b in enumerate(self.BUCKETS) if seconds <= b), len(self.BUCKETS))
            self.hist[i] += 1
            self.hist_sum += seconds

    def response(self, status: int) -> None:
        with self.mu:
            self.requests[status] = self.requests.get(status, 0) + 1

    def text(self, live: int, terminals: int = 0, running: int = 0,
             making: int = 0) -> str:
        """`making`: creates under way, each holding a place among max_sandboxes."""
        with self.mu:
            out = ["# TYPE corral_sandboxes_live gauge", f"corral_sandboxes_live {live}",
                   "# TYPE corral_sandboxes_making gauge",
                   f"corral_sandboxes_making {making}",
                   "# TYPE corral_terminals_open gauge",
                   f"corral_terminals_open {terminals}",
                   "# TYPE corral_running gauge", f"corral_running {running}",
                   "# TYPE corral_sandboxes_created_total counter",
                   f"corral_sandboxes_created_total {self.created}",
                   "# TYPE corral_runs_total counter"]
            out += [f'corral_runs_total{{verdict="{v}"}} {n}' for v, n in sorted(self.runs.items())]
            out.append("# TYPE corral_denials_total counter")
            out += [f'corral_denials_total{{kind="{k}"}} {n}'
                    for k, n in sorted(self.denials.items())]
            out.append("# TYPE corral_http_responses_total counter")
            out += [f'corral_http_responses_total{{status="{s}"}} {n}'
                    for s, n in sorted(self.requests.items())]
            out += ["# TYPE corral_http_lean_exec_total counter",
                    f"corral_http_lean_exec_total {self.lean}",
                    "# TYPE corral_http_lean_exec_loop_total counter",
                    f"corral_http_lean_exec_loop_total {self.lean_loop}"]
            out.append("# TYPE corral_run_seconds histogram")
            acc = 0
            for b, n in zip(self.BUCKETS, self.hist):
                acc += n
                out.append(f'corral_run_seconds_bucket{{le="{b}"}} {acc}')
            acc += self.hist[-1]
            out += [f'corral_run_seconds_bucket{{le="+Inf"}} {acc}',
                    f"corral_run_seconds_sum {self.hist_sum:.6f}",
                    f"corral_run_seconds_count {acc}"]
        return "\n".join(out) + "\n"


def denial_kind(ev) -> str | None:
    """The kind of a Result's event that says something was refused, else None: a
    connection or a secret denied or withheld by the proxy, a limit that stopped the
    command, a refused run, a refused system call (audit/query.py's denials, same rule)."""
    if not isinstance(ev, dict):
        return None
    kind = ev.get("kind")
    if kind in ("net", "secret"):
        return kind if ev.get("decision") in ("deny", "withheld") else None
    return kind if kind in ("limit", "refused", "syscall") else None
