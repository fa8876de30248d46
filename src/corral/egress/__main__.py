"""One egress proxy process per sandbox.

    python -m corral.egress --config-fd N --listen-fd M --events-fd K
    python -m corral.egress --config FILE --listen 127.0.0.1:0 [--events FILE]   (tests, debugging)

--config-fd / --config   one JSON object (NetConfig.to_json()), read to EOF
--listen-fd              a listening TCP socket (the supervisor made it inside the sandbox's
                         network namespace); --listen HOST:PORT binds one here instead
--events-fd / --events   JSON lines, one per decision (default: stdout)
--hosts FILE             the hosts file names resolve through before DNS (default: /etc/hosts)
--die-with-parent        PR_SET_PDEATHSIG(SIGTERM): exit when the parent thread exits

When listening it prints ``corral-egress: listening on HOST:PORT`` on stderr. It exits on
SIGTERM or SIGINT (cutting open connections, whose events are still written), or when the
reader of a pipe --events-fd closes it (the supervisor is gone). A listening socket keeps its
network namespace alive, so the supervisor must end the proxy when it tears the sandbox down:
SIGTERM it, or close the events pipe.

With secret grants (NetConfig.secrets) the proxy holds the values and the run CA's key in
memory only, and makes itself non-dumpable (no core file, no ptrace or /proc/PID/mem for
processes of its uid); everything it writes to stderr passes through a redactor that swaps
each value for its placeholder; a bad CA or upstream_ca file ends it with status 2 before
it listens.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import stat
import sys


def _read_fd(fd: int) -> bytes:
    chunks = []
    while True:
        b = os.read(fd, 65536)
        if not b:
            break
        chunks.append(b)
    os.close(fd)
    return b"".join(chunks)


def _listen(text: str) -> socket.socket:
    host, _, port = text.rpartition(":")
    host = host.strip("[]") or "127.0.0.1"
    fam = socket.AF_INET6 if ":" in host else socket.AF_INET
    s = socket.socket(fam, socket.SOCK_STREAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind((host, int(port)))
    s.listen(4096)
    return s


class _EventWriter:
    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.broken = False

    def __call__(self, event: dict) -> None:
        if self.broken:
            return
        data = (json.dumps(event, separators=(",", ":")) + "\n").encode()
        try:
            while data:
                n = os.write(self.fd, data)
                data = data[n:]
        except BrokenPipeError:
            self.broken = True


class _Redacting:
    """stderr for a proxy that holds secret values: everything written (tracebacks included)
    goes through `redact` first, which puts each value's placeholder in its place."""

    def __init__(self, stream, redact) -> None:
        self._stream, self._redact = stream, redact

    def write(self, text: str) -> int:
        self._stream.write(self._redact(text))
        return len(text)

    def flush(self) -> None:
        self._stream.flush()

    def __getattr__(self, name: str):
        return getattr(self._stream, name)


def _not_dumpable() -> None:
    """PR_SET_DUMPABLE 0: no core dump holds the values, and processes of the same uid
    without CAP_SYS_PTRACE can neither ptrace this one nor read its /proc/PID/mem."""
    import ctypes

    ctypes.CDLL(None, use_errno=True).prctl(4, 0, 0, 0, 0)   # PR_SET_DUMPABLE


_PARSER: argparse.ArgumentParser | None = None


def parser() -> argparse.ArgumentParser:
    """The argument parser, built once (the zygote builds it for all its children)."""
    global _PARSER
    if _PARSER is None:
        p = argparse.ArgumentParser(prog="python -m corral.egress",
                                    description=__doc__.split("\n")[0])
        cfg_g = p.add_mutually_exclusive_group(required=True)
        cfg_g.add_argument("--config-fd", type=int)
        cfg_g.add_argument("--config")
        lis_g = p.add_mutually_exclusive_group(required=True)
        lis_g.add_argument("--listen-fd", type=int)
        lis_g.add_argument("--listen")
        ev_g = p.add_mutually_exclusive_group()
        ev_g.add_argument("--events-fd", type=int)
        ev_g.add_argument("--events")
        p.add_argument("--hosts", default=None)
        p.add_argument("--die-with-parent", action="store_true")
        # for a supervisor: {"open": N} / {"closed": N} lines beside the events, and each
        # event's "conn": N (server.py, EgressProxy(track_conns=True))
        p.add_argument("--track-conns", action="store_true")
        _PARSER = p
    return _PARSER


def main(argv: list[str] | None = None) -> int:
    p = parser()
    args = p.parse_args(argv)

    from ..errors import CorralError
    from .config import NetConfig

    if args.die_with_parent:
        import ctypes
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM, 0, 0, 0)  # PR_SET_PDEATHSIG
        boot = sys.modules.get("corral.egress.boot")
        if boot is not None and os.getppid() != boot.PARENT:
            return 0  # the parent died before the signal was asked for: nobody to serve

    try:
        if args.config_fd is not None:
            raw = _read_fd(args.config_fd)
        else:
            with open(args.config, "rb") as f:
                raw = f.read()
        cfg = NetConfig.from_json(raw)
    except (CorralError, OSError) as e:
        print(f"corral-egress: {e}", file=sys.stderr)
        return 2

    if args.events_fd is not None:
        events_fd = args.events_fd
    elif args.events is not None:
        events_fd = os.open(args.events, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    else:
        events_fd = sys.stdout.fileno()
    emit = _EventWriter(events_fd)

    import asyncio
    import ssl

    from .server import EgressProxy, connections_within, nofile_for, raise_nofile

    # every connection under the cap must get its descriptors: with fewer, the cap would
    # be the kernel's EMFILE instead of our 503, and accepts would stall. boot.py lifts the
    # hard limit while it is root; what is left of a lower one lowers the cap (never raises it)
    nofile = raise_nofile(nofile_for(cfg.max_connections))
    fit = connections_within(nofile)
    if fit < 1:
        print(f"corral-egress: RLIMIT_NOFILE is {nofile}, too low to serve a single "
              f"connection; raise it to {nofile_for(cfg.max_connections)}", file=sys.stderr)
        return 2
    if fit < cfg.max_connections:
        import dataclasses

        print(f"corral-egress: RLIMIT_NOFILE is {nofile}: at most {fit} connections at once "
              f"(not {cfg.max_connections})", file=sys.stderr)
        cfg = dataclasses.replace(cfg, max_connections=fit)

    if cfg.secrets:
        _not_dumpable()

    from . import hostsfile

    hosts, why = hostsfile.load(args.hosts or hostsfile.PATH)
    if why:
        print(f"corral-egress: {why}", file=sys.stderr)
    try:
        proxy = EgressProxy(cfg, emit, hosts=hosts, track_conns=args.track_conns)
    except (ValueError, TypeError, OSError, ssl.SSLError) as e:
        # messages of LeafCache and upstream_context name the field, never key material
        print(f"corral-egress: {e}", file=sys.stderr)
        return 2
    if cfg.secrets:
        sys.stderr = _Redacting(sys.stderr, proxy.redact)

    if args.listen_fd is not None:
        listener = socket.socket(fileno=args.listen_fd)
    else:
        listener = _listen(args.listen)
    name = listener.getsockname()
    print(f"corral-egress: listening on {name[0]}:{name[1]}", file=sys.stderr, flush=True)

    async def run() -> None:
        loop = asyncio.get_running_loop()
        task = asyncio.create_task(proxy.serve(listener))
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, task.cancel)
        if args.events_fd is not None and stat.S_ISFIFO(os.fstat(events_fd).st_mode):
            # the write end of a pipe polls as ready when its reader is gone
            loop.add_reader(events_fd, task.cancel)
        try:
            await task
        except asyncio.CancelledError:
            pass

    asyncio.run(run())
    return 0


if __name__ == "__main__":
    sys.exit(main())
