"""atheris target: the run_code runner's channel (runtime/session.py FrameReader and
check_message). Frames, or ProtocolError; what the runner's encoder writes reads back."""

from _common import Input, run

from corral.guest.runner import frame
from corral.runtime.session import FrameReader, ProtocolError, check_message


def read(pieces):
    r = FrameReader(1 << 16)
    out = []
    try:
        for p in pieces:
            for msg, n in r.feed(p):
                try:
                    out.append((check_message(msg), n))
                except ProtocolError:
                    out.append(("bad", n))
    except ProtocolError:
        return out, "error"
    return out, None


def one_input(data: bytes) -> None:
    whole = read([data])
    cut = read(Input(data).cuts(data))
    assert cut[1] == whole[1] and cut[0][:len(whole[0])] == whole[0]
    text = data.decode("utf-8", "surrogateescape")
    back = read([frame({"type": "stdout", "text": text})])
    assert back == ([("stdout", back[0][0][1])], None), back


if __name__ == "__main__":
    run(one_input)
