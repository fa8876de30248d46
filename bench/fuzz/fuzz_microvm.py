"""atheris target: the microvm agent's frames, both sides (guest/microvm_agent.py's
Channel over a pipe, backends/microvm.py's FrameReader and parse_exit). Frames or the
documented refusal (ValueError on the host, the agent's SystemExit), cut anywhere."""

import os

from _common import Input, run

from corral.backends.microvm import FrameReader, parse_exit
from corral.guest.microvm_agent import Channel


def host(pieces):
    r = FrameReader(b"OEX")
    out = []
    try:
        for p in pieces:
            out += r.feed(p)
    except ValueError:
        return out, "error"
    for kind, data in out:
        if kind == b"X":
            try:
                parse_exit(data)
            except ValueError:
                pass
    return out, bytes(r.buf)


def guest(data: bytes):
    r, w = os.pipe()
    try:
        os.write(w, data[:60000])
        try:
            return Channel(r).feed()
        except SystemExit:
            return "exit"
    finally:
        os.close(r)
        os.close(w)


def one_input(data: bytes) -> None:
    whole = host([data])
    cut = host(Input(data).cuts(data))
    assert cut[1] == "error" if whole[1] == "error" else cut == whole
    if data:
        guest(data)


if __name__ == "__main__":
    run(one_input)
